"""The goals of the performance issue as a table: ``numerator / denominator <= bound``.

Each figure is a :class:`Ref` into one run's results (:mod:`bench.report` evaluates them,
warm and cold); a row whose bound is ``None`` is context.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GOALS", "Goal", "Ref", "RAW_LOADS", "INPLACE", "STAGED", "DEFAULT"]

MIB = 1 << 20
RAW_LOADS = ("raw readinto", "raw preadv x2", "raw mmap+copy_")


@dataclass(frozen=True)
class Ref:
    """A figure of the run: a group's way (or the fastest of several ways) for an operation.

    ``kind`` is ``state`` or ``optimizer``; ``stat`` is ``time`` (seconds: warm median, or
    the cold probe), ``per_tensor`` (µs per tensor), ``cpu_per_tensor`` (CPU µs per tensor,
    warm: ``time.process_time`` of the call, every thread), ``memory`` (peak growth, MiB),
    ``size`` (a file's bytes, MiB) or ``read`` (bytes read, MiB: ``open_checkpoint``).
    """

    group: str
    op: str
    ways: tuple[str, ...]
    kind: str = "state"
    stat: str = "time"

    def value(self, report: dict, cache: str) -> float | None:
        """The figure in ``report`` (the fastest of the ways), or ``None`` if not measured."""
        from bench.report import figure

        values = [figure(report, self, way, cache) for way in self.ways]
        values = [v for v in values if v is not None]
        return min(values) if values else None


@dataclass(frozen=True)
class Goal:
    """A row of the goal table: ``numerator / denominator`` (or the numerator alone when
    the denominator is ``None``) must be at most ``bound`` (below it when ``strict``)."""

    text: str
    numerator: Ref
    denominator: Ref | None
    bound: float | None
    strict: bool = False
    caches: tuple[str, ...] = ("warm", "cold")


def _r(group: str, op: str, *ways: str, kind: str = "state", stat: str = "time") -> Ref:
    return Ref(group, op, ways, kind, stat)


INPLACE, STAGED, DEFAULT = "tlckpt in place", "tlckpt staged", "tlckpt default"
W = ("warm",)


def _large(
    group: str, size: str, safetensors: str, raw_caches: tuple[str, ...], *extra: Goal
) -> list[Goal]:
    """A 512 MiB group's rows: its load in place against safetensors and against the best
    raw read (measured with ``raw_caches``), then ``extra``, then its save against a raw
    durable write."""
    return [
        Goal(
            f"{size}load in place vs {safetensors}",
            _r(group, "load", INPLACE),
            _r(group, "load", "safetensors"),
            1.0,
        ),
        Goal(
            f"{size}load in place vs the best raw method",
            _r(group, "load", INPLACE),
            _r(group, "load", *RAW_LOADS),
            1.1,
            caches=raw_caches,
        ),
        *extra,
        Goal(
            f"{size}save vs raw durable write",
            _r(group, "save", "tlckpt"),
            _r(group, "save", "raw write"),
            1.1,
            caches=W,
        ),
    ]


#: The goals of the performance issue, and context rows (bound ``None``).
GOALS: list[Goal] = [
    *_large(
        "big1",
        "512 MiB ",
        "safetensors load_file + copy_",
        ("warm", "cold"),
        Goal(
            "512 MiB default load (under a read lease) vs safetensors load_file + copy_",
            _r("big1", "load", DEFAULT),
            _r("big1", "load", "safetensors"),
            1.0,
        ),
        Goal(
            "512 MiB default load (under a read lease) vs the best raw method",
            _r("big1", "load", DEFAULT),
            _r("big1", "load", *RAW_LOADS),
            1.3,
        ),
        Goal(
            "512 MiB default load where no lease is granted (staged) vs safetensors",
            _r("big1", "load", STAGED),
            _r("big1", "load", "safetensors"),
            None,
        ),
    ),
    *_large("big48", "512 MiB in 48 tensors: ", "safetensors", W),
    *(
        Goal(f"20,000 small tensors: {what}, CPU µs per tensor", ref, None, 2.0, caches=W)
        for what, ref in [
            ("save", _r("small", "save", "tlckpt", stat="cpu_per_tensor")),
            ("default load", _r("small", "load", DEFAULT, stat="cpu_per_tensor")),
        ]
    ),
    *(
        Goal(f"20,000 small tensors: {what}, wall µs per tensor", ref, None, None, caches=W)
        for what, ref in [
            ("save", _r("small", "save", "tlckpt", stat="per_tensor")),
            ("default load", _r("small", "load", DEFAULT, stat="per_tensor")),
            ("staged load (no lease)", _r("small", "load", STAGED, stat="per_tensor")),
            ("load in place", _r("small", "load", INPLACE, stat="per_tensor")),
        ]
    ),
    *(
        Goal(
            f"20,000 small tensors: {op} vs {lib} (≥ 10x faster)",
            _r("small", op, "tlckpt" if op == "save" else DEFAULT),
            _r("small", op, lib),
            0.1,
            caches=W,
        )
        for op in ("save", "load")
        for lib in ("safetensors", "torch")
    ),
    *(
        Goal(
            f"inspect of 10^6 empty records, {what}: seconds",
            _r("inspect", "inspect", way),
            None,
            2.0,
            caches=W,
        )
        for what, way in [("alike", "alike"), ("changing shapes", "varied")]
    ),
    Goal(
        "GPT-2 small: load_module_state (default) vs safetensors load_file + load_state_dict",
        _r("gpt2", "load", DEFAULT),
        _r("gpt2", "load", "safetensors"),
        1.0,
    ),
    *(
        Goal(
            f"GPT-2 small: load_module_state ({label}) vs torch.load + load_state_dict",
            _r("gpt2", "load", way),
            _r("gpt2", "load", "torch"),
            None,
        )
        for label, way in (
            ("default", DEFAULT),
            ("no lease: staged", STAGED),
            ("in place", INPLACE),
        )
    ),
    Goal(
        "GPT-2 small: load_optimizer vs torch.load + opt.load_state_dict",
        _r("gpt2", "load", "tlckpt", kind="optimizer"),
        _r("gpt2", "load", "torch", kind="optimizer"),
        1.0,
        strict=True,
    ),
    *(
        Goal(
            f"GPT-2 small: {call} vs torch.save + fsync",
            _r("gpt2", "save", "tlckpt", kind=kind),
            _r("gpt2", "save", "torch", kind=kind),
            None,
            caches=W,
        )
        for call, kind in [("save_module_state", "state"), ("save_optimizer", "optimizer")]
    ),
    *(
        Goal(
            f"Memory: {text}, MiB over the live state",
            _r(g, op, way, kind=k, stat="memory"),
            None,
            bound,
            caches=("cold",) if op == "load" else W,
        )
        for text, g, op, way, k, bound in [
            ("512 MiB save", "big1", "save", "tlckpt", "state", 16.0),
            ("512 MiB load in place", "big1", "load", INPLACE, "state", 16.0),
            ("512 MiB default load", "big1", "load", DEFAULT, "state", 16.0),
            (
                "512 MiB staged load (one copy of the state by design)",
                "big1",
                "load",
                STAGED,
                "state",
                None,
            ),
            ("20,000 small tensors: save", "small", "save", "tlckpt", "state", 16.0),
            ("20,000 small tensors: load in place", "small", "load", INPLACE, "state", 16.0),
            ("GPT-2 small: load in place", "gpt2", "load", INPLACE, "state", 16.0),
            ("GPT-2 small: default load", "gpt2", "load", DEFAULT, "state", 16.0),
            ("GPT-2 small: save_optimizer", "gpt2", "save", "tlckpt", "optimizer", 16.0),
            (
                "GPT-2 small: load_optimizer (new moments by design)",
                "gpt2",
                "load",
                "tlckpt",
                "optimizer",
                None,
            ),
        ]
    ),
    # Issue #21: a bf16 model of >= 100M parameters in a set (a safetensors member).
    Goal(
        "bf16 model in a set: CheckpointManager.save vs save_file + fsync",
        _r("bf16", "save", "tlckpt set"),
        _r("bf16", "save", "safetensors"),
        1.3,
        caches=W,
    ),
    Goal(
        "bf16 model in a set: restore (digests verified) vs load_file + load_state_dict",
        _r("bf16", "load", "tlckpt set"),
        _r("bf16", "load", "safetensors"),
        1.3,
    ),
    Goal(
        "bf16 model in a set: model member size vs the safetensors file",
        _r("bf16", "size", "tlckpt set", stat="size"),
        _r("bf16", "size", "safetensors", stat="size"),
        1.01,
        caches=W,
    ),
    Goal(
        "open_checkpoint of the bf16 file (256 MiB; quick: 16): MiB read before a tensor is read",
        _r("bf16", "open", "open_checkpoint", stat="read"),
        None,
        1.0,
        caches=W,
    ),
    # Issue #23: the safetensors-layout family standalone.
    Goal(
        "bf16 model: save_module_state(.safetensors) vs save_file + fsync",
        _r("bf16", "save", "tlckpt"),
        _r("bf16", "save", "safetensors"),
        1.1,
        caches=W,
    ),
    Goal(
        "bf16 model: load_module_state(.safetensors) vs load_file + load_state_dict",
        _r("bf16", "load", "tlckpt"),
        _r("bf16", "load", "safetensors"),
        1.0,
    ),
    # Issue #23: sharded save and load (FSDP2 model + AdamW, gloo) against DCP, per world.
    *(
        Goal(
            f"Sharded, world {world} (64 MiB + AdamW; quick: 8): {op} with {label} vs DCP",
            _r("sharded", op, f"world {world}: {way}"),
            _r("sharded", op, f"world {world}: dcp"),
            1.0,
            caches=W,
        )
        for world in (2, 3)
        for op in ("save", "load")
        for label, way in (("the file functions", "tlckpt"), ("a checkpoint set", "set"))
    ),
    *(
        Goal(
            f"Sharded, world {world}: save(blocking=False), the call, vs the blocking set save",
            _r("sharded", "save", f"world {world}: set background"),
            _r("sharded", "save", f"world {world}: set"),
            0.3 if world == 2 else None,
            caches=W,
        )
        for world in (2, 3)
    ),
    *(
        Goal(
            f"exact-bits JSON: {op} vs the standard library's json (≥ 3x faster)",
            _r("json", op, "tlckpt"),
            _r("json", op, "json"),
            1 / 3,
            caches=W,
        )
        for op in ("save", "load")
    ),
]

"""One workload in its own process, every library in turns: ``python -m bench.group '<spec>'``.

The spec names the group (``big1``, ``big48``, ``small``, ``gpt2``, ``json``, ``inspect``,
``bf16``, ``sharded``),
the run mode, the repetitions and a scratch folder. The process builds the live state
(untimed), times every save way in turns, then every load way in turns (each repetition
preceded by its untimed preparation, ``os.sync()`` and ``gc.collect()``), then checks that
each load way lands the saved values (the live state is zeroed, loaded once more and
compared, CRC-32 per tensor). It prints one line ``BENCH-RESULT <json>``; the files stay in
the scratch folder for the fresh-process probes (:mod:`bench.probe`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Callable

import torch

from bench.measure import Way, interleave
from bench.models import SIZES, Size, gpt2, gpt2_optimizer, json_values, small_model, state_model
from bench.ways import checksums, moments, optimizer_ways, state_ways, unique_tensors

__all__ = ["MARKER", "GROUPS", "build", "main"]

MARKER = "BENCH-RESULT "


def _verify(tensors: list[torch.Tensor], loads: dict[str, Way]) -> dict[str, bool]:
    """Whether each load way reproduces the saved values in the live tensors."""
    reference = checksums(tensors)
    ok = {}
    for name, way in loads.items():
        with torch.no_grad():
            for t in tensors:
                t.zero_()
        way.run()
        ok[name] = checksums(tensors) == reference
    return ok


def build(group: str, size: Size) -> dict:
    """The live state of a group (the same values in every process)."""
    if group == "big1":
        return {"module": state_model(1, size.big_bytes // 4)}
    if group == "big48":
        return {"module": state_model(48, size.big_bytes // 4)}
    if group == "small":
        return {"module": small_model(size)}
    if group == "gpt2":
        module = gpt2(size)
        return {"module": module, "optimizer": gpt2_optimizer(module)}
    if group == "json":
        return {"values": json_values(size)}
    if group == "bf16":
        from bench.bf16 import bf16_model

        return {"module": bf16_model(*size.bf16)}
    return {}


def _state_group(live: dict, folder: str, reps: int, raw_loads: tuple[str, ...]) -> dict:
    module = live["module"]
    saves, loads = state_ways(module, folder)
    loads = {k: v for k, v in loads.items() if not k.startswith("raw") or k in raw_loads}
    tensors = unique_tensors(module)
    cpu: dict[str, dict[str, list[float]]] = {"save": {}, "load": {}}
    out = {
        "payload_bytes": sum(t.numel() * t.element_size() for t in tensors),
        "tensor_count": len(module.state_dict()),
        "times": {
            "save": interleave(saves, reps, cpu=cpu["save"]),
            "load": interleave(loads, reps, cpu=cpu["load"]),
        },
        "cpu": cpu,
        "verified": _verify(tensors, loads),
    }
    out["file_bytes"] = {
        name: os.path.getsize(os.path.join(folder, f)) for name, f in _files(folder).items()
    }
    if "optimizer" in live:
        opt = live["optimizer"]
        saves, loads = optimizer_ways(module, opt, folder)
        state = moments(opt)
        cpu = {"save": {}, "load": {}}
        out["optimizer"] = {
            "payload_bytes": sum(t.numel() * t.element_size() for t in state),
            "tensor_count": len(state),
            "times": {
                "save": interleave(saves, reps, cpu=cpu["save"]),
                "load": interleave(loads, reps, cpu=cpu["load"]),
            },
            "cpu": cpu,
        }
        # A load replaces the moment tensors: check the new ones against the saved values.
        reference = checksums(state)
        out["optimizer"]["verified"] = {}
        for name, way in loads.items():
            with torch.no_grad():
                for t in moments(opt):
                    t.zero_()
            way.run()
            out["optimizer"]["verified"][name] = checksums(moments(opt)) == reference
    return out


def _files(folder: str) -> dict[str, str]:
    return {f: f for f in sorted(os.listdir(folder)) if not f.startswith(".")}


def _json_group(live: dict, folder: str, reps: int) -> dict:
    from bench.json_ways import json_ways

    values = live["values"]
    saves, loads, results = json_ways(values, folder)
    times = {"save": interleave(saves, reps), "load": interleave(loads, reps)}
    want = values.numpy().view("u4")
    verified = {}
    for name, way in loads.items():
        results.pop(name, None)
        way.run()
        got = results.get(name)
        verified[name] = got is not None and bool((got.view("u4") == want).all())
    return {
        "payload_bytes": values.numel() * 4,
        "tensor_count": 1,
        "times": times,
        "verified": verified,
    }


def _inspect_group(size: Size, folder: str, reps: int) -> dict:
    import tlckpt
    from bench.scan_records import write_many

    files = write_many(folder, size.inspect_records)
    ways = {label: Way(lambda p=path: tlckpt.inspect(p)) for label, path in files.items()}
    return {
        "records": size.inspect_records,
        "times": {"inspect": interleave(ways, reps)},
        "verified": {label: True for label in files},
    }


def _bf16_group(live: dict, folder: str, reps: int) -> dict:
    from bench.bf16 import bf16_ways, member_sizes, open_bytes

    module = live["module"]
    saves, loads = bf16_ways(module, folder)
    tensors = unique_tensors(module)
    out = {
        "payload_bytes": sum(t.numel() * t.element_size() for t in tensors),
        "tensor_count": len(module.state_dict()),
        "times": {"save": interleave(saves, reps), "load": interleave(loads, reps)},
        "verified": _verify(tensors, loads),
        "file_bytes": member_sizes(folder),
        "bytes_read": open_bytes(folder),
    }
    return out


def _sharded_group(size: Size, folder: str, reps: int) -> dict:
    """FSDP2 model + AdamW at worlds 2 and 3 against DCP: each world's ranks are processes
    of their own (gloo), started from this one (:func:`bench.sharded.group_result`)."""
    from bench.sharded import WORLDS, group_result

    return group_result(size.sharded_mib, WORLDS, reps, folder)


GROUPS: dict[str, Callable[[dict, Size, str, int], dict]] = {
    "big1": lambda live, s, f, r: _state_group(
        live, f, r, ("raw readinto", "raw preadv x2", "raw mmap+copy_")
    ),
    "big48": lambda live, s, f, r: _state_group(
        live, f, r, ("raw readinto", "raw preadv x2", "raw mmap+copy_")
    ),
    "small": lambda live, s, f, r: _state_group(live, f, r, ("raw readinto",)),
    "gpt2": lambda live, s, f, r: _state_group(live, f, r, ("raw readinto", "raw preadv x2")),
    "json": lambda live, s, f, r: _json_group(live, f, r),
    "inspect": lambda live, s, f, r: _inspect_group(s, f, r),
    "bf16": lambda live, s, f, r: _bf16_group(live, f, r),
    "sharded": lambda live, s, f, r: _sharded_group(s, f, r),
}


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    size = SIZES[spec["mode"]]
    if spec.get("sharded_mib"):
        size = dataclasses.replace(size, sharded_mib=spec["sharded_mib"])
    live = build(spec["group"], size)
    result = GROUPS[spec["group"]](live, size, spec["folder"], spec["reps"])
    result["group"] = spec["group"]
    print(MARKER + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

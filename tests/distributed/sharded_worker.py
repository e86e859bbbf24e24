"""One rank of a sharded-checkpoint test group (started by ``sharded_support.launch``).

Usage (``torchrun``-style environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT):
``python sharded_worker.py WORKDIR CHECK...``. The group initialises gloo once and runs the
checks in order, all ranks together; each rank writes ``results-w{W}-r{R}.json`` in WORKDIR
after every check (check name → ``{"ok": bool, ...}``), which the tests then read.
Files are exchanged between groups (and the pytest process) through WORKDIR:
``w{W}/model.tlsf32``, ``state.json``, ``opt.tladam``, ``saved.pt`` and ``continued.pt``.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import orjson
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sharded_support import (
    K,
    N,
    TiedNet,
    differences,
    local_slice,
    make_adam,
    max_difference,
    plain_copy,
    snapshot,
    train,
)

from tlckpt.runtime import (
    load_module_state,
    load_optimizer,
    load_state_bits,
    save_module_state,
    save_optimizer,
    save_state_bits,
    schema_of,
)
from tlckpt.runtime.collectives import scatter
from tlckpt.runtime.dtensors import local_tensor

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
WORKDIR = Path(sys.argv[1])
MINE = WORKDIR / f"w{WORLD}"
CHECKS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {}


def check(fn: Callable[[dict[str, Any]], dict[str, Any]]):
    CHECKS[fn.__name__] = fn
    return fn


def sharded_model(mesh: Any, seed: int) -> tuple[TiedNet, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = TiedNet()
    fully_shard(model.mix, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, make_adam("adamw", model.parameters())


def on_writer(fn: Callable[[], Any]) -> Any:
    return fn() if RANK == 0 else None


def local_state(model: torch.nn.Module, opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Clones of this rank's own memory: local shards, buffers, optimizer state."""
    out = [local_tensor(t).clone() for t in model.state_dict(keep_vars=True).values()]
    for group in opt.param_groups:
        for p in group["params"]:
            for value in opt.state.get(p, {}).values():
                out.append(local_tensor(value).clone())
    return out


def unchanged(before: list[torch.Tensor], after: list[torch.Tensor]) -> bool:
    from sharded_support import same

    return len(before) == len(after) and all(same(a, b) for a, b in zip(before, after))


def load_all(model: Any, opt: Any, folder: Path, bits: bool = False) -> int | None:
    if bits:
        load_state_bits(model, folder / "state.json")
    else:
        load_module_state(model, folder / "model.tlsf32")
    return load_optimizer(opt, model, folder / "opt.tladam", restore_random_counter=True)


def shards_match(model: Any, opt: Any, expected: dict[str, Any]) -> list[str]:
    """Where this rank's shards differ from its rows of the expected full values."""
    bad = []
    for name, t in model.state_dict(keep_vars=True).items():
        want = expected["state"][name]
        want = local_slice(want, RANK, WORLD) if isinstance(t, DTensor) else want
        if not torch.equal(local_tensor(t), want):
            bad.append(name)
    names = {id(p): n for n, p in model.named_parameters()}
    for group in opt.param_groups:
        for p in group["params"]:
            for key, value in opt.state.get(p, {}).items():
                want = expected["optimizer"][names[id(p)]][key]
                if isinstance(value, DTensor):
                    want = local_slice(want, RANK, WORLD)
                if not torch.equal(local_tensor(value), want):
                    bad.append(f"{names[id(p)]}.{key}")
    return bad


@check
def sharded_run(ctx: dict[str, Any]) -> dict[str, Any]:
    """Train K steps sharded, save, compare with a single process holding the full values;
    then train N more steps (the original run's continuation)."""
    model, opt = sharded_model(ctx["mesh"], seed=0)
    counter = train(model, opt, 0, K)
    on_writer(lambda: MINE.mkdir(exist_ok=True))
    dist.barrier()
    save_module_state(model, MINE / "model.tlsf32")
    save_state_bits(model, MINE / "state.json")
    version = save_optimizer(opt, model, MINE / "opt.tladam", random_counter=counter)
    # The parameters as a one-shot generator (deduplicated: no tied slots), and the state
    # as a mapping, work as for one process.
    by_generator = save_optimizer(opt, model.parameters(), MINE / "generator.tladam")
    save_module_state(dict(model.state_dict(keep_vars=True)), MINE / "mapping.tlsf32")
    saved = snapshot(model, opt)
    identical: dict[str, bool] = {}

    def single_process_files() -> None:
        plain, plain_opt = plain_copy(saved)
        save_module_state(plain, MINE / "plain.tlsf32")
        save_state_bits(plain, MINE / "plain.json")
        plain_version = save_optimizer(plain_opt, plain, MINE / "plain.tladam", random_counter=K)
        for ours, theirs in [("model.tlsf32", "plain.tlsf32"), ("state.json", "plain.json")]:
            identical[ours] = (MINE / ours).read_bytes() == (MINE / theirs).read_bytes()
        identical["opt.tladam"] = (MINE / "opt.tladam").read_bytes() == (
            MINE / "plain.tladam"
        ).read_bytes() and plain_version == version
        plain_by_generator = save_optimizer(plain_opt, plain.parameters(), MINE / "plain-gen")
        identical["generator.tladam"] = (
            plain_by_generator == by_generator == 2
            and (MINE / "generator.tladam").read_bytes() == (MINE / "plain-gen").read_bytes()
        )
        identical["mapping.tlsf32"] = (MINE / "mapping.tlsf32").read_bytes() == (
            MINE / "plain.tlsf32"
        ).read_bytes()
        torch.save(saved, MINE / "saved.pt")

    on_writer(single_process_files)
    train(model, opt, K, N)
    continued = snapshot(model, opt)
    on_writer(lambda: torch.save(continued, MINE / "continued.pt"))
    ctx["trained"] = (model, opt)
    dist.barrier()
    sizes = {n: tuple(local_tensor(p).shape) for n, p in model.named_parameters()}
    same_schema = schema_of(model) == schema_of(TiedNet())
    return {
        "version": version,
        "identical": identical,
        "local_shapes": sizes,
        "same_schema": same_schema,
    }


@check
def resume_same_world(ctx: dict[str, Any]) -> dict[str, Any]:
    """Load this world's files into fresh sharded objects; continue; compare bit for bit."""
    saved = torch.load(MINE / "saved.pt", weights_only=True)
    continued = torch.load(MINE / "continued.pt", weights_only=True)
    model, opt = sharded_model(ctx["mesh"], seed=1234)
    fresh_differs = bool(differences(snapshot(model, opt), saved))
    counter = load_all(model, opt, MINE)
    after_load = differences(snapshot(model, opt), saved)
    slices = shards_match(model, opt, saved)
    train(model, opt, K, N)
    after_training = differences(snapshot(model, opt), continued)
    tied = model.head.weight is model.emb.weight
    bits_model, bits_opt = sharded_model(ctx["mesh"], seed=99)
    load_all(bits_model, bits_opt, MINE, bits=True)
    after_bits = differences(snapshot(bits_model, bits_opt), saved)
    return {
        "fresh_differs": fresh_differs,
        "counter": counter,
        "after_load": after_load,
        "slices": slices,
        "after_training": after_training,
        "tied": tied,
        "after_bits_load": after_bits,
    }


@check
def single_process_file_into_shards(ctx: dict[str, Any]) -> dict[str, Any]:
    """Files written by one process load into W shards: each shard is its rows."""
    folder = WORKDIR / "w1"
    saved = torch.load(folder / "saved.pt", weights_only=True)
    model, opt = sharded_model(ctx["mesh"], seed=77)
    load_all(model, opt, folder)
    slices = shards_match(model, opt, saved)
    gathered = differences(snapshot(model, opt), saved)
    bits_model, bits_opt = sharded_model(ctx["mesh"], seed=78)
    load_all(bits_model, bits_opt, folder, bits=True)
    return {
        "slices": slices,
        "gathered": gathered,
        "bits_slices": shards_match(bits_model, bits_opt, saved),
    }


@check
def other_world_into_shards(ctx: dict[str, Any]) -> dict[str, Any]:
    """The world-2 run's files load into this world; continue and compare with world 2."""
    folder = WORKDIR / "w2"
    saved = torch.load(folder / "saved.pt", weights_only=True)
    continued = torch.load(folder / "continued.pt", weights_only=True)
    model, opt = sharded_model(ctx["mesh"], seed=55)
    counter = load_all(model, opt, folder)
    after_load = differences(snapshot(model, opt), saved)
    slices = shards_match(model, opt, saved)
    train(model, opt, K, N)
    now = snapshot(model, opt)
    # The same arithmetic: this world's run from the same values, installed by hand.
    twin, twin_opt = sharded_model(ctx["mesh"], seed=56)
    install_by_hand(twin, twin_opt, saved)
    train(twin, twin_opt, K, N)
    return {
        "counter": counter,
        "after_load": after_load,
        "slices": slices,
        "matches_same_arithmetic": differences(now, snapshot(twin, twin_opt)),
        "continuation_bit_exact": not differences(now, continued),
        "continuation_max_difference": max_difference(now, continued),
    }


def install_by_hand(model: Any, opt: Any, values: dict[str, Any]) -> None:
    """Full values into sharded objects with ``torch.chunk`` rows (no tlckpt involved)."""
    from tlckpt.runtime.dtensors import like_dtensor

    with torch.no_grad():
        for name, t in model.state_dict(keep_vars=True).items():
            want = values["state"][name]
            if isinstance(t, DTensor):
                want = local_slice(want, RANK, WORLD)
            local_tensor(t).copy_(want)
    params = dict(model.named_parameters())
    for name, entry in values["optimizer"].items():
        p = params[name]
        opt.state[p] = {
            "step": entry["step"].clone(),
            "exp_avg": like_dtensor(local_slice(entry["exp_avg"], RANK, WORLD).clone(), p),
            "exp_avg_sq": like_dtensor(local_slice(entry["exp_avg_sq"], RANK, WORLD).clone(), p),
        }


def attempt(action: Callable[[], Any]) -> dict[str, Any]:
    try:
        action()
    except Exception as exc:
        return {"raised": type(exc).__name__, "message": str(exc)}
    return {"raised": None, "message": ""}


def corruptions(folder: Path, out: Path) -> dict[str, tuple[str, Path]]:
    """Damaged copies of this world's files: name → (which loader, path)."""
    out.mkdir(exist_ok=True)
    model = (folder / "model.tlsf32").read_bytes()
    opt = (folder / "opt.tladam").read_bytes()
    state = (folder / "state.json").read_bytes()
    shape = bytearray(model)
    shape[31] += 1  # first tensor's first dim
    # head.weight (tied to emb.weight) is the last tensor but one; head.bias (7 floats, after
    # a 24-byte header) is last: flip a bit of head.weight's last value.
    tie = bytearray(model)
    tie[len(model) - 7 * 4 - 24 - 4] ^= 0x01
    flip_beta = bytearray(opt)
    flip_beta[15 + 8] ^= 0x01  # beta1's lowest mantissa bit (v4: kind at 15, betas at 23)
    variants = {
        "model_truncated": ("model", model[:-3]),
        "model_trailing": ("model", model + b"\0"),
        "model_shape": ("model", bytes(shape)),
        "model_foreign": ("model", b"NOTTLSF" + model[7:]),
        "model_tie_conflict": ("model", bytes(tie)),
        "opt_truncated": ("opt", opt[: len(opt) // 2]),
        "opt_config_bit": ("opt", bytes(flip_beta)),
        "opt_trailing": ("opt", opt + b"\0\0"),
        "opt_version": ("opt", opt[:7] + (9).to_bytes(8, "little") + opt[15:]),
        "bits_truncated": ("bits", state[:-10]),
        "bits_tag": ("bits", state.replace(b"float32_bits", b"float64_bits", 1)),
    }
    made = {}
    for name, (kind, data) in variants.items():
        path = out / name
        if RANK == 0:
            path.write_bytes(data)
        made[name] = (kind, path)
    made["model_missing"] = ("model", out / "does-not-exist")
    made["opt_counter_not_asked_for"] = ("opt_no_restore", folder / "opt.tladam")
    dist.barrier()
    return made


@check
def corrupted_files(ctx: dict[str, Any]) -> dict[str, Any]:
    """Each damaged file: every rank raises the same error; nothing changes anywhere."""
    model, opt = ctx["trained"]
    out = {}
    for name, (kind, path) in corruptions(MINE, MINE / "bad").items():
        before = local_state(model, opt)
        if kind == "model":
            result = attempt(lambda p=path: load_module_state(model, p))
        elif kind == "bits":
            result = attempt(lambda p=path: load_state_bits(model, p))
        elif kind == "opt_no_restore":  # a sound file with a counter nobody asked for
            result = attempt(lambda p=path: load_optimizer(opt, model, p))
        else:
            result = attempt(lambda p=path: load_optimizer(opt, model, p))
        result["unchanged"] = unchanged(before, local_state(model, opt))
        out[name] = result
    return out


@check
def rank_local_failures(ctx: dict[str, Any]) -> dict[str, Any]:
    """A failure on the last rank alone (while its shards are being built; or a model that
    differs from the others') makes every rank raise, and nothing changes anywhere."""
    model, opt = ctx["trained"]
    out = {}
    real = scatter._part_of
    calls = {"n": 0}

    def failing_part(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        if RANK == WORLD - 1 and calls["n"] == 3:
            raise MemoryError("injected: no memory for this shard")
        return real(full, like)

    for name, action in [
        ("model", lambda: load_module_state(model, MINE / "model.tlsf32")),
        (
            "optimizer",
            lambda: load_optimizer(opt, model, MINE / "opt.tladam", restore_random_counter=True),
        ),
        ("bits", lambda: load_state_bits(model, MINE / "state.json")),
    ]:
        calls["n"] = 0
        scatter._part_of = failing_part
        try:
            before = local_state(model, opt)
            result = attempt(action)
            result["unchanged"] = unchanged(before, local_state(model, opt))
        finally:
            scatter._part_of = real
        out[f"injected_{name}"] = result

    # The last rank passes one tensor fewer: the ranks' layouts differ.
    tensors = list(model.state_dict(keep_vars=True).values())
    mine = tensors[:-1] if RANK == WORLD - 1 else tensors
    before = local_state(model, opt)
    result = attempt(lambda: load_module_state(mine, MINE / "model.tlsf32"))
    result["unchanged"] = unchanged(before, local_state(model, opt))
    out["different_layout"] = result
    return out


@check
def save_failures(ctx: dict[str, Any]) -> dict[str, Any]:
    """Saving: a refusal or a file-system error on rank 0 is raised on every rank."""
    model, opt = ctx["trained"]
    out = {
        "missing_directory": attempt(
            lambda: save_module_state(model, MINE / "no" / "such" / "dir.tlsf32")
        ),
        "optimizer_missing_directory": attempt(
            lambda: save_optimizer(opt, model, MINE / "no" / "such" / "dir.tladam")
        ),
    }
    amsgrad = torch.optim.AdamW(model.parameters(), amsgrad=True)
    out["amsgrad"] = attempt(lambda: save_optimizer(amsgrad, model, MINE / "never.tladam"))
    out["nothing_written"] = not (MINE / "never.tladam").exists()
    return out


@check
def distribute_tensor_float64(ctx: dict[str, Any]) -> dict[str, Any]:
    """DTensors made by ``distribute_tensor`` (Shard(0), Shard(1), Replicate; a tied repeat;
    a frozen one), float64: exact-bits JSON and an Adam v5 file, equal to a single
    process's, and loaded back."""
    mesh = ctx["mesh"]
    g = torch.Generator().manual_seed(5)

    def values() -> list[torch.Tensor]:
        return [
            torch.randn(shape, generator=g, dtype=torch.float64)
            for shape in [(5, 3), (3, 7), (4,), (2, 2)]
        ]

    def build(full_values: list[torch.Tensor]) -> list[torch.Tensor]:
        placements = [[Shard(0)], [Shard(1)], [Replicate()], [Shard(0)]]
        made = []
        for value, placement in zip(full_values, placements):
            made.append(torch.nn.Parameter(distribute_tensor(value, mesh, placement)))
        made[3].requires_grad_(False)
        return [made[0], made[1], made[0], made[2], made[3]]  # slot 2 is tied to slot 0

    full_values = values()
    params = build(full_values)
    opt = torch.optim.AdamW([params[0], params[1], params[3]], lr=0.1, weight_decay=0.01)
    grads = values()
    for step in range(2):
        for p, grad in zip([params[0], params[1], params[3]], grads[:3]):
            p.grad = distribute_tensor(grad * (step + 1), mesh, p.placements)
        opt.step()
    folder = MINE / "dt64"
    on_writer(lambda: folder.mkdir(exist_ok=True))
    dist.barrier()
    save_state_bits(params, folder / "state.json")
    version = save_optimizer(opt, params, folder / "opt.tladam")
    gathered = [p.full_tensor().detach() for p in params]
    moments = {
        i: {
            k: (v.full_tensor() if isinstance(v, DTensor) else v).clone()
            for k, v in opt.state[params[i]].items()
        }
        for i in (0, 1, 3)
    }
    identical = {}

    def single_process() -> None:
        plain = [torch.nn.Parameter(t.clone()) for t in gathered[:2]] + [None, None, None]
        plain[2] = plain[0]
        plain[3] = torch.nn.Parameter(gathered[3].clone())
        plain[4] = torch.nn.Parameter(gathered[4].clone(), requires_grad=False)
        plain_opt = torch.optim.AdamW([plain[0], plain[1], plain[3]], lr=0.1, weight_decay=0.01)
        for i in (0, 1, 3):
            plain_opt.state[plain[i]] = {k: v.clone() for k, v in moments[i].items()}
        save_state_bits(plain, folder / "plain.json")
        plain_version = save_optimizer(plain_opt, plain, folder / "plain.tladam")
        identical["state.json"] = (folder / "state.json").read_bytes() == (
            folder / "plain.json"
        ).read_bytes()
        identical["opt.tladam"] = (
            plain_version == version
            and (folder / "opt.tladam").read_bytes() == (folder / "plain.tladam").read_bytes()
        )

    on_writer(single_process)
    fresh = build([torch.zeros_like(t) for t in full_values])
    fresh_opt = torch.optim.AdamW([fresh[0], fresh[1], fresh[3]], lr=0.1, weight_decay=0.01)
    load_state_bits(fresh, folder / "state.json")
    load_optimizer(fresh_opt, fresh, folder / "opt.tladam")
    loaded_equal = all(torch.equal(a.full_tensor(), b) for a, b in zip(fresh, gathered))
    moments_equal = all(
        torch.equal(fresh_opt.state[fresh[i]][k].full_tensor(), moments[i][k])
        if k != "step"
        else torch.equal(fresh_opt.state[fresh[i]][k], moments[i][k])
        for i in (0, 1, 3)
        for k in moments[i]
    )
    placements_kept = all(
        fresh_opt.state[fresh[i]]["exp_avg"].placements == fresh[i].placements for i in (0, 1, 3)
    )
    dist.barrier()
    return {
        "version": version,
        "identical": identical,
        "loaded_equal": loaded_equal,
        "moments_equal": moments_equal,
        "placements_kept": placements_kept,
    }


def word_view(t: torch.Tensor) -> torch.Tensor:
    """The storage words of ``t``, to compare bit for bit in any dtype."""
    if t.dtype == torch.complex32:
        t = t.to(torch.complex64)  # exact; torch compares no complex32
    if t.is_complex():
        t = torch.view_as_real(t)
    return t.view(
        {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    )


@check
def exact_bits_dtypes(ctx: dict[str, Any]) -> dict[str, Any]:
    """Exact-bits JSON of DTensors in every dtype family a backend may not carry as such
    (float8, complex32, bfloat16, complex128), row-sharded, column-sharded and replicated,
    next to a plain integer tensor: the file equals a single process's; it loads back."""
    mesh = ctx["mesh"]
    out = {}
    layouts = [[Shard(0)], [Shard(1)], [Replicate()]]
    for dtype in [
        torch.float8_e4m3fn,
        torch.bfloat16,
        torch.complex32,
        torch.complex128,
    ]:
        g = torch.Generator().manual_seed(11)
        full_values = []
        for shape in [(5, 3), (3, 5), (4,)]:
            real = torch.randn(shape, generator=g, dtype=torch.float64)
            value = torch.complex(real, -real) if dtype.is_complex else real
            full_values.append(value.to(dtype))

        def build(values: list[torch.Tensor]) -> list[torch.Tensor]:
            made = [
                distribute_tensor(v, mesh, p, src_data_rank=None) for v, p in zip(values, layouts)
            ]
            return [*made, torch.arange(3)]

        name = str(dtype).removeprefix("torch.")
        path = MINE / f"bits-{name}.json"
        save_state_bits(build(full_values), path)
        identical = None
        if RANK == 0:
            save_state_bits([*full_values, torch.arange(3)], MINE / f"plain-{name}.json")
            identical = path.read_bytes() == (MINE / f"plain-{name}.json").read_bytes()
        fresh = build([torch.zeros_like(v) for v in full_values])
        load_state_bits(fresh, path)
        # Each rank's shard against DTensor's own split of the expected values (no
        # communication: gloo carries no float8).
        expected = build(full_values)
        loaded = [
            torch.equal(word_view(local_tensor(t)), word_view(local_tensor(want)))
            for t, want in zip(fresh, expected)
        ]
        out[name] = {"identical": identical, "loaded": all(loaded)}
    return out


@check
def hsdp_meshes(ctx: dict[str, Any]) -> dict[str, Any]:
    """FSDP2 over two-dimensional meshes (HSDP: ``(Replicate(), Shard(0))``), both ways
    round: save, load into fresh objects, train on; bit for bit with the uninterrupted run."""
    out = {}
    for shape in [(WORLD, 1), (1, WORLD)]:
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=("replicate", "shard"))
        model, opt = sharded_model(mesh, seed=0)
        train(model, opt, 0, K)
        folder = MINE / f"hsdp-{shape[0]}x{shape[1]}"
        on_writer(lambda f=folder: f.mkdir(exist_ok=True))
        dist.barrier()
        save_module_state(model, folder / "model.tlsf32")
        save_optimizer(opt, model, folder / "opt.tladam")
        saved = snapshot(model, opt)
        fresh, fresh_opt = sharded_model(mesh, seed=3)
        load_module_state(fresh, folder / "model.tlsf32")
        load_optimizer(fresh_opt, fresh, folder / "opt.tladam")
        after_load = differences(snapshot(fresh, fresh_opt), saved)
        train(model, opt, K, N)
        train(fresh, fresh_opt, K, N)
        out[f"{shape[0]}x{shape[1]}"] = {
            "placements": str(model.emb.weight.placements),
            "after_load": after_load,
            "after_training": differences(snapshot(fresh, fresh_opt), snapshot(model, opt)),
        }
    return out


@check
def checkpoint_sets(ctx: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint set of the sharded run: every rank saves, rank 0 commits; its model
    member is the single-process file; a restore into fresh shards equals the saved run."""
    import tlckpt

    model, opt = sharded_model(ctx["mesh"], seed=0)
    counter = train(model, opt, 0, K)
    manager = tlckpt.CheckpointManager(MINE / "sets")
    folder = manager.save(K, model=model, optimizer=opt, random_counter=counter).wait()
    dist.barrier()
    same_model = on_writer(
        lambda: (folder / "model.tlsf32").read_bytes() == (MINE / "model.tlsf32").read_bytes()
    )
    verified = on_writer(lambda: tlckpt.verify_checkpoint(folder).world_size)
    saved = torch.load(MINE / "saved.pt", weights_only=True)
    fresh, fresh_opt = sharded_model(ctx["mesh"], seed=4321)
    restored = manager.restore(model=fresh, optimizer=fresh_opt)
    after = differences(snapshot(fresh, fresh_opt), saved)
    try:
        manager.save(K + 1, model=model, optimizer=opt, blocking=False)
        background = "accepted"
    except tlckpt.CheckpointError as exc:
        background = str(exc)
    dist.barrier()
    return {
        "steps": manager.steps(),
        "same_model": same_model,
        "world_size": verified,
        "counter": restored.random_counter,
        "after_restore": after,
        "background": background,
    }


@check
def memory(ctx: dict[str, Any]) -> dict[str, Any]:
    """Rank 0's resident-set peak while saving a model of large parameters."""
    from measure_memory import measure

    return measure(ctx["mesh"], WORKDIR / f"w{WORLD}" / "memory")


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    ctx: dict[str, Any] = {"mesh": init_device_mesh("cpu", (WORLD,))}
    results: dict[str, Any] = {}
    out = WORKDIR / f"results-w{WORLD}-r{RANK}.json"
    try:
        for name in sys.argv[2:]:
            try:
                results[name] = {"ok": True, **CHECKS[name](ctx)}
            except Exception:
                results[name] = {"ok": False, "error": traceback.format_exc()}
            out.write_bytes(orjson.dumps(results, default=str))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

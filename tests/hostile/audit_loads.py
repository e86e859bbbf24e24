"""Run every load path under audit hooks and tripwires; print what ran as JSON.

Used by ``test_no_code_execution.py`` in a fresh interpreter (audit hooks cannot be removed):

    python tests/hostile/audit_loads.py VECTORS_DIR WORK_DIR

Phase 1 ("formats"): every TorchLean load path — the codec readers, ``inspect``, the runtime
loaders, the command line's ``inspect``/``validate``, and ``convert``'s TLSF32B/JSON/
safetensors readers — on valid files, every invalid vector and mutated files; and every
checkpoint-set path (``load_checkpoint``, ``verify_checkpoint``,
``CheckpointManager.restore``, the command line's ``ls``/``verify``) on a saved set and on
copies with a byte flipped in each member, manifest included. After a warm-up
pass (so that lazy imports happen before watching), a ``sys.addaudithook`` hook records
``exec``/``compile`` (code objects run or compiled), ``import``, ``pickle.*`` and
``marshal.*`` events and process-spawning events; ``pickle.load(s)``, ``pickle.Unpickler``,
``_pickle``'s twins, ``marshal.loads`` and ``torch.load`` are replaced by tripwires that record
a call and refuse it.

Phase 2 ("pt"): ``convert``'s ``.pt`` reader, the one torch deserialisation, with
``torch.load`` wrapped to record its keyword arguments.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import traceback
import warnings
from pathlib import Path

FORBIDDEN_MODULES = {
    "pickle",
    "_pickle",
    "cPickle",
    "dill",
    "cloudpickle",
    "joblib",
    "shelve",
    "marshal",
    "pickletools",
    "copyreg",
}
SPAWN_EVENTS = {
    "os.system",
    "os.exec",
    "os.posix_spawn",
    "os.spawn",
    "os.fork",
    "os.forkpty",
    "subprocess.Popen",
    "ctypes.dlopen",
    "ctypes.cdata",
}


def _flipped(files: list[Path], per_file: int, mask: int, prefix: str) -> list[Path]:
    """Mutants of ``files`` beside them: about ``per_file`` of each, one byte XORed with
    ``mask`` at evenly spaced offsets."""
    mutants = []
    for i, f in enumerate(files):
        data = f.read_bytes()
        for j in range(0, len(data), max(1, len(data) // per_file)):
            mutant = f.with_name(f"{prefix}{i}_{j}{f.suffix}")
            mutant.write_bytes(data[:j] + bytes([data[j] ^ mask]) + data[j + 1 :])
            mutants.append(mutant)
    return mutants


def main(vectors: Path, work: Path) -> dict:
    import numpy as np
    import torch

    import tlckpt
    from tlckpt.cli import convert
    from tlckpt.cli import main as cli_main
    from tlckpt.codec import MomentDtype

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from fuzz.mutators import apply, systematic
    from fuzz.seeds import readers, vector_seeds

    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    work.mkdir(parents=True, exist_ok=True)

    # ---- files to load: runtime-written ones, vectors, mutants, safetensors, .pt
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    tlckpt.save_module_state(model, work / "m.tlsf32")
    tlckpt.save_state_bits(model, work / "m.json")
    tlckpt.save_optimizer(opt, model, work / "o.tladam")
    convert.convert(
        work / "m.tlsf32", work / "m.safetensors", src_format="tlsf32", dst_format="safetensors"
    )
    convert.convert(work / "m.tlsf32", work / "m.pt", src_format="tlsf32", dst_format="pt")

    # A checkpoint set, and copies with a byte flipped in each member (manifest included).
    import shutil

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    sets = work / "sets"
    good_set = tlckpt.save_checkpoint(
        sets / "step-00000000000000000001",
        model=model,
        optimizer=opt,
        scheduler=sched,
        random_counter=3,
        extra={"inf": float("inf"), "t": (1, 2)},
        step=1,
    )
    damaged_sets = []
    for member in sorted(good_set.iterdir()):
        data = member.read_bytes()
        for j in range(0, len(data), max(1, len(data) // 6)):
            copy = work / "damaged" / f"{member.stem}_{j}"
            shutil.copytree(good_set, copy)
            (copy / member.name).write_bytes(data[:j] + bytes([data[j] ^ 0x41]) + data[j + 1 :])
            damaged_sets.append(copy)

    seeds = vector_seeds(vectors)
    mutants = []
    for k, seed in enumerate(seeds):
        specs = list(systematic(seed.data, seed.binary, seed=k))
        for spec in specs[:: max(1, len(specs) // 12)]:
            mutants.append((seed, apply(seed.data, spec, {})))
    runtime_files = [work / "m.tlsf32", work / "m.json", work / "o.tladam"]
    runtime_files += _flipped(runtime_files, 10, 0xFF, "mut")

    # The safetensors layout: model state by name, a state tree, and mutants of both.
    tlckpt.save_module_state(model, work / "n.safetensors")
    tlckpt.save_state(
        {"model": model.state_dict(), "step": 3, "t": (1.5, None)}, work / "s.safetensors"
    )
    named_files = [work / "n.safetensors", work / "s.safetensors"]
    named_files += _flipped(named_files, 24, 0x5A, "nmut")

    # Optimizer trees (every optimizer but Adam/AdamW), in a set too, and mutants.
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(5, 4)).sum().backward()
    sgd.step()
    tlckpt.save_optimizer(sgd, model, work / "t.optree")
    tree_set = tlckpt.save_checkpoint(work / "sgd_set", model=model, optimizer=sgd, step=2)
    tree_files = [work / "t.optree"]
    data = tree_files[0].read_bytes()
    for j in range(0, len(data), max(1, len(data) // 40)):
        mutant = work / f"tmut_{j}.optree"
        mutant.write_bytes(data[:j] + bytes([data[j] ^ 0x5A]) + data[j + 1 :])
        tree_files.append(mutant)

    def open_and_read(p):
        with tlckpt.open_checkpoint(p) as f:
            return [f.tensor(n) for n in f.names()]

    def calls():
        for f in named_files:
            yield f"load_module_state:{f.name}", lambda p: tlckpt.load_module_state(model, p), f
            yield f"load_tensors:{f.name}", tlckpt.load_tensors, f
            yield f"load_state:{f.name}", tlckpt.load_state, f
            yield f"read_metadata:{f.name}", tlckpt.read_metadata, f
            yield f"open_checkpoint:{f.name}", open_and_read, f
            yield f"tlckpt.inspect:{f.name}", tlckpt.inspect, f
        for f in tree_files:
            yield f"load_optimizer:{f.name}", lambda p: tlckpt.load_optimizer(sgd, model, p), f
            yield f"tlckpt.inspect:{f.name}", tlckpt.inspect, f
            yield f"open_checkpoint:{f.name}", open_and_read, f
            yield f"cli validate:{f.name}", lambda p: cli_main(["validate", str(p)]), f
        yield (
            f"load_checkpoint:{tree_set.name}",
            lambda p: tlckpt.load_checkpoint(p, model=model, optimizer=sgd),
            tree_set,
        )
        for seed in seeds:
            for label, fn in readers(seed):
                yield f"{label}:{seed.name}", fn, io.BytesIO(seed.data)
        for seed, data in mutants:
            for label, fn in readers(seed):
                yield f"{label}:mutant:{seed.name}", fn, io.BytesIO(data)
        for f in runtime_files:
            if f.suffix == ".tladam":
                yield f"load_optimizer:{f.name}", lambda p: tlckpt.load_optimizer(opt, model, p), f
            elif f.suffix == ".tlsf32":
                yield f"load_module_state:{f.name}", lambda p: tlckpt.load_module_state(model, p), f
                yield f"convert.read_state:{f.name}", lambda p: convert.read_state(p, "tlsf32"), f
            else:
                yield f"load_state_bits:{f.name}", lambda p: tlckpt.load_state_bits(model, p), f
                yield f"convert.read_state:{f.name}", lambda p: convert.read_state(p, "json"), f
            yield f"cli inspect:{f.name}", lambda p: cli_main(["inspect", str(p)]), f
            yield f"cli validate:{f.name}", lambda p: cli_main(["validate", str(p)]), f
            yield f"tlckpt.inspect:{f.name}", tlckpt.inspect, f
        for f in [work / "m.safetensors"]:
            yield f"convert.read_state:{f.name}", lambda p: convert.read_state(p, "safetensors"), f
        for folder in [good_set, *damaged_sets]:
            yield (
                f"load_checkpoint:{folder.name}",
                lambda p: tlckpt.load_checkpoint(
                    p, model=model, optimizer=opt, scheduler=sched, rng=True
                ),
                folder,
            )
            yield f"verify_checkpoint:{folder.name}", tlckpt.verify_checkpoint, folder
            yield f"cli verify:{folder.name}", lambda p: cli_main(["verify", str(p)]), folder
        yield (
            "CheckpointManager.restore",
            lambda p: tlckpt.CheckpointManager(p).restore(model=model, optimizer=opt),
            sets,
        )
        yield "cli ls", lambda p: cli_main(["ls", str(p)]), sets
        yield (
            "read_adam f64",
            lambda p: tlckpt.read_adam(p, tlckpt.schema_of(model), dtype=MomentDtype.FLOAT64),
            work / "o.tladam",
        )
        _ = np

    def run_all() -> dict[str, int]:
        outcome = {"ok": 0, "checkpoint_error": 0, "other": 0}
        devnull = open(os.devnull, "w")  # noqa: SIM115 - closed below
        saved = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = devnull
        try:
            for label, fn, arg in calls():
                if isinstance(arg, io.BytesIO):
                    arg.seek(0)
                try:
                    fn(arg)
                    outcome["ok"] += 1
                except tlckpt.CheckpointError:
                    outcome["checkpoint_error"] += 1
                except Exception as exc:  # recorded: the test fails on any of these
                    outcome["other"] += 1
                    frames = traceback.extract_tb(exc.__traceback__)
                    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
                    others.append(f"{label}: {type(exc).__name__}: {exc}{where}")
        finally:
            sys.stdout, sys.stderr = saved
            devnull.close()
        return outcome

    others: list[str] = []
    warmup_outcome = run_all()  # warm-up: lazy imports happen now, unwatched
    warmup_others = list(others)
    others.clear()

    # ---- watch
    events: list[tuple] = []
    watching = {"on": False}

    def hook(event: str, args: tuple) -> None:
        if not watching["on"]:
            return
        if event == "exec":
            code = args[0]
            events.append(
                ("exec", getattr(code, "co_filename", "?"), getattr(code, "co_name", "?"))
            )
        elif event == "compile":
            events.append(("compile", repr(args[1])[:200]))
        elif event == "import":
            events.append(("import", args[0]))
        elif event.startswith(("pickle.", "marshal.")) or event in SPAWN_EVENTS:
            events.append((event, repr(args)[:200]))

    sys.addaudithook(hook)

    tripped: list[str] = []

    def tripwire(name: str):
        def refuse(*a, **k):
            tripped.append(name)
            raise RuntimeError(f"tripwire: {name} called on a load path")

        return refuse

    import _pickle
    import marshal
    import pickle

    originals = {}
    for mod, names in (
        (pickle, ("load", "loads", "Unpickler", "_load", "_loads", "_Unpickler")),
        (_pickle, ("load", "loads", "Unpickler")),
        (marshal, ("load", "loads")),
        (torch, ("load",)),
    ):
        for name in names:
            if hasattr(mod, name):
                originals[(mod, name)] = getattr(mod, name)
                setattr(mod, name, tripwire(f"{mod.__name__}.{name}"))
    watching["on"] = True
    formats_outcome = run_all()
    watching["on"] = False
    formats_events = list(events)
    formats_others = list(others)
    formats_tripped = list(tripped)
    # Canary: the hook and the tripwires are live (a test that sees nothing proves nothing).
    events.clear()
    watching["on"] = True
    eval(compile("1 + 1", "<canary>", "eval"))
    with contextlib.suppress(RuntimeError):
        pickle.loads(b"\x80\x04K\x01.")
    watching["on"] = False
    canary = {"events": list(events), "tripped": [t for t in tripped if "pickle" in t]}
    for (mod, name), fn in originals.items():
        setattr(mod, name, fn)

    # ---- phase 2: the .pt reader
    events.clear()
    loads: list[dict] = []
    real_load = torch.load

    def recording_load(*a, **k):
        loads.append(
            {"args": [repr(x)[:100] for x in a], "kwargs": {k2: repr(v) for k2, v in k.items()}}
        )
        return real_load(*a, **k)

    torch.load = recording_load
    watching["on"] = True
    pt_error = None
    try:
        convert.read_state(work / "m.pt", "pt")
    except Exception as exc:
        pt_error = repr(exc)
    watching["on"] = False
    torch.load = real_load
    pt_events = list(events)
    return {
        "formats": {
            "outcome": formats_outcome,
            "events": formats_events,
            "tripped": formats_tripped,
            "non_checkpoint_errors": formats_others[:20],
            "warmup_outcome": warmup_outcome,
            "warmup_non_checkpoint_errors": warmup_others[:20],
        },
        "canary": canary,
        "pt": {"torch_load_calls": loads, "events": pt_events, "error": pt_error},
    }


if __name__ == "__main__":
    result = main(Path(sys.argv[1]), Path(sys.argv[2]))
    print("AUDIT-RESULT " + json.dumps(result))

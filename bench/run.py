"""Orchestrator: every workload in a process of its own, fresh-process probes, the reports.

``.venv/bin/python -m bench [--quick] [--only GROUP ...] [--reps N]`` from the repository
root writes ``bench/results/<YYYY-MM-DD>.{json,md,png}`` (``<date>-quick.*`` with
``--quick``, ``<date>[-quick]-partial.*`` with ``--only``; ``--sharded-mib N`` sizes the
``sharded`` group). Scratch files live in a folder
under ``--tmp`` (default ``/tmp``), removed at the end, whatever happens. No environment
variable is set for the timed processes: they run with the allocator users have.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.group import GROUPS, MARKER
from bench.models import SIZES
from bench.report import write_reports

__all__ = ["main", "PROBES", "REPS"]

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"

#: Timed repetitions per group (after one untimed round), all libraries in turns.
REPS = {
    "full": {
        "big1": 5,
        "big48": 5,
        "small": 7,
        "gpt2": 3,
        "json": 3,
        "inspect": 3,
        "bf16": 5,
        "sharded": 5,
    },
    "quick": {
        "big1": 2,
        "big48": 2,
        "small": 2,
        "gpt2": 2,
        "json": 2,
        "inspect": 2,
        "bf16": 2,
        "sharded": 2,
    },
}
_BIG_LOADS = ("tlckpt default", "tlckpt staged", "tlckpt in place", "torch", "safetensors")
#: Fresh-process probes per group: (kind, op, way, cache). Cold loads, and the peak memory
#: of saves and loads (the cold probes' memory serves for the loads).
PROBES: dict[str, list[tuple[str, str, str, str]]] = {
    "big1": [
        *(("state", "load", w, "cold") for w in _BIG_LOADS),
        *(("state", "load", w, "cold") for w in ("raw readinto", "raw preadv x2")),
        ("state", "load", "raw mmap+copy_", "cold"),
        *(("state", "save", w, "warm") for w in ("tlckpt", "torch", "safetensors")),
    ],
    # Fewer cold probes where no goal is cold (each probe is a fresh process).
    "big48": [
        ("state", "load", w, "cold") for w in ("tlckpt default", "tlckpt in place", "safetensors")
    ],
    "small": [
        *(("state", "load", w, "cold") for w in ("tlckpt default", "tlckpt in place")),
        ("state", "save", "tlckpt", "warm"),
    ],
    "gpt2": [
        *(("state", "load", w, "cold") for w in _BIG_LOADS),
        ("optimizer", "load", "tlckpt", "cold"),
        ("optimizer", "load", "torch", "cold"),
        ("optimizer", "save", "tlckpt", "warm"),
    ],
    "json": [],
    "inspect": [],
    "bf16": [("state", "load", w, "cold") for w in ("tlckpt set", "tlckpt", "safetensors")],
    # Its goals are warm (every rank a process of its own; no fresh-process probe).
    "sharded": [],
}
#: Scratch space the largest group needs at once (512 MiB x four libraries, and margin).
DISK_NEEDED = {"full": 6 << 30, "quick": 1 << 30}
TIMEOUT_S = {"full": 900, "quick": 300}


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small workloads (smoke run)")
    parser.add_argument("--only", action="append", choices=sorted(GROUPS), help="a group")
    parser.add_argument("--reps", type=int, help="repetitions per operation (every group)")
    parser.add_argument(
        "--sharded-mib", type=int, help="MiB of parameters of the sharded group (64; quick: 8)"
    )
    parser.add_argument("--no-probes", action="store_true", help="skip fresh-process probes")
    parser.add_argument(
        "--cold-rounds",
        type=int,
        help="rounds of a group's fresh-process probes, ways in turns (3; quick: 1): cold"
        " figures are their medians",
    )
    parser.add_argument("--tmp", default="/tmp", help="parent of the scratch folder")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results folder")
    return parser.parse_args(argv)


def _run(module: str, spec: dict, timeout: int) -> dict:
    """Run ``python -m module '<spec>'``; its ``BENCH-RESULT`` line, or an error."""
    try:
        proc = subprocess.run(
            [sys.executable, "-m", module, json.dumps(spec)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {**spec, "error": f"timed out after {timeout} s"}
    for line in proc.stdout.splitlines():
        if line.startswith(MARKER):
            return json.loads(line[len(MARKER) :])
    return {**spec, "error": f"{module} exited {proc.returncode} without a result"}


def _read_text(path: str) -> str:
    try:
        return Path(path).read_text(encoding="ascii", errors="replace")
    except OSError:
        return ""


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def _machine() -> dict:
    import numpy
    import orjson
    import safetensors
    import torch

    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in _read_text("/proc/cpuinfo").splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    mem = next(
        (
            int(line.split()[1]) * 1024
            for line in _read_text("/proc/meminfo").splitlines()
            if line.startswith("MemTotal:")
        ),
        None,
    )
    try:
        import transformers

        tf_version = transformers.__version__
    except ImportError:
        tf_version = None
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "mem_bytes": mem,
        "thp": _read_text("/sys/kernel/mm/transparent_hugepage/enabled").strip(),
        "versions": {
            "torch": torch.__version__,
            "numpy": numpy.__version__,
            "safetensors": safetensors.__version__,
            "orjson": orjson.__version__,
            "transformers": tf_version,
            "torch_threads": torch.get_num_threads(),
        },
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(_git("status", "--porcelain")),
    }


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    mode = "quick" if args.quick else "full"
    groups = args.only or list(GROUPS)
    free = shutil.disk_usage(args.tmp).free
    if free < DISK_NEEDED[mode]:
        print(
            f"{args.tmp}: {free >> 20} MiB free, {DISK_NEEDED[mode] >> 20} needed", file=sys.stderr
        )
        return 2
    started = dt.datetime.now()
    t0 = time.perf_counter()
    loads: list[tuple[float, float, float]] = [os.getloadavg()]
    scratch = tempfile.mkdtemp(prefix="tlckpt-bench-", dir=args.tmp)
    rounds = args.cold_rounds or (1 if args.quick else 3)
    results: dict[str, dict] = {}
    probes: list[dict] = []
    try:
        for group in groups:
            folder = os.path.join(scratch, group)
            os.mkdir(folder)
            reps = args.reps or REPS[mode][group]
            spec = {"group": group, "mode": mode, "reps": reps, "folder": folder}
            if group == "sharded" and args.sharded_mib:
                spec["sharded_mib"] = args.sharded_mib
            print(f"{group} (reps={reps})", file=sys.stderr, flush=True)
            results[group] = _run("bench.group", spec, TIMEOUT_S[mode])
            if "error" in results[group]:
                print(f"  {group}: {results[group]['error']}", file=sys.stderr, flush=True)
            elif not args.no_probes:
                # One call in a fresh process is at the mercy of the disk's moment (single
                # cold loads of one file measured 0.5 to 15 s on the project's machine): the
                # probes run in rounds, every way once per round, and report their median.
                for r in range(rounds):
                    for kind, op, way, cache in PROBES[group]:
                        probe = {**spec, "kind": kind, "op": op, "way": way, "cache": cache}
                        print(
                            f"  probe {kind} {op} {way} ({cache}, round {r + 1}/{rounds})",
                            file=sys.stderr,
                            flush=True,
                        )
                        probes.append(_run("bench.probe", probe, TIMEOUT_S[mode]))
            loads.append(os.getloadavg())
            shutil.rmtree(folder, ignore_errors=True)
        machine = _machine()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    wall = time.perf_counter() - t0
    command = "python -m bench" + "".join(f" {shlex.quote(a)}" for a in (argv or sys.argv[1:]))
    sizes = SIZES[mode].as_dict()
    if args.sharded_mib:
        sizes["sharded_mib"] = args.sharded_mib
    report = {
        "meta": {
            "started": started.isoformat(timespec="seconds"),
            "mode": mode,
            "command": command,
            "wall_s": wall,
            "loadavg": loads,
            "sizes": sizes,
            "reps": {g: args.reps or REPS[mode][g] for g in groups},
            "cold_rounds": rounds,
            "machine": machine,
        },
        "groups": results,
        "probes": probes,
    }
    stem = started.date().isoformat() + ("-quick" if args.quick else "")
    if args.only:
        stem += "-partial"
    args.out.mkdir(parents=True, exist_ok=True)
    json_path = args.out / f"{stem}.json"
    json_path.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    md_path, png_path = write_reports(report, args.out / stem)
    print(md_path.read_text(encoding="utf-8").split("\n## Results")[0])
    print(f"wall {wall:.1f} s; wrote {json_path}, {md_path}, {png_path}", file=sys.stderr)
    failed = [g for g, r in results.items() if "error" in r] + [
        p["way"] for p in probes if "error" in p
    ]
    return 1 if failed else 0

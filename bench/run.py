"""Orchestrator: every case in a fresh process, then the JSON, Markdown and PNG reports.

``.venv/bin/python -m bench [--quick] [--only PATTERN ...] [--reps N]`` from the repository
root. Writes ``bench/results/<YYYY-MM-DD>.{json,md,png}`` (``<date>-quick.*`` with
``--quick``). Scratch files live in a temporary folder under ``--tmp`` (default ``/tmp``)
that is removed at the end, whatever happens.
"""

from __future__ import annotations

import argparse
import datetime as dt
import fnmatch
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

from bench.cases import CASES, case_names
from bench.report import write_reports
from bench.worker import MARKER

__all__ = ["main"]

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"

#: Repetitions per workload and mode: enough for a median on this noisy machine while the
#: whole suite stays under 10 minutes on 2 cores.
REPS = {
    "full": {"W1": 3, "W2": 5, "W3": 3, "W4": 3},
    "quick": {"W1": 3, "W2": 3, "W3": 3, "W4": 3},
}
#: Scratch space the largest case needs at once (W3: 2 GiB file + margin; W1: 1 GiB).
DISK_NEEDED = {"full": 5 << 30, "quick": 1 << 30}
#: Untimed calls of every operation before its repetitions: first-call costs (lazy imports,
#: caches, the page cache of the first file) stay out of the medians; they are reported.
WARMUP = 1
CASE_TIMEOUT_S = {"full": 300, "quick": 120}

#: Large allocations always through mmap, so freed tensors go back to the OS and each
#: repetition's peak/retained RSS is measured against the same baseline (glibc's dynamic
#: threshold would otherwise keep some in the heap after the first repetition).
WORKER_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 20)}
#: Workloads measured with the allocator as users have it. W4 has no memory goal, and
#: forcing every buffer over 1 MiB through mmap (fresh, page-faulted memory per call)
#: taxes its large parse buffers but not the stdlib's small objects: measured 105 vs
#: 170 ms for the same read.
DEFAULT_ALLOCATOR_WORKLOADS = ("W4",)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small workloads (smoke run)")
    parser.add_argument(
        "--only",
        action="append",
        metavar="PATTERN",
        help="run only cases matching this glob (repeatable), e.g. 'W1-*' or '*-tlckpt'",
    )
    parser.add_argument("--reps", type=int, help="repetitions per operation (all workloads)")
    parser.add_argument("--tmp", default="/tmp", help="parent of the scratch folder")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results folder")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    return parser.parse_args(argv)


def _selected(patterns: list[str] | None) -> list[str]:
    names = case_names()
    if not patterns:
        return names
    return [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)]


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


def _machine(tmp: str) -> dict:
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
    status = _git("status", "--porcelain")
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "mem_bytes": mem,
        "tmp_filesystem": _filesystem_of(tmp),
        "versions": {
            "torch": torch.__version__,
            "numpy": numpy.__version__,
            "safetensors": safetensors.__version__,
            "orjson": orjson.__version__,
            "torch_threads": torch.get_num_threads(),
        },
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": None if status is None else bool(status),
    }


def _filesystem_of(path: str) -> str | None:
    best, fstype = "", None
    real = os.path.realpath(path)
    for line in _read_text("/proc/mounts").splitlines():
        parts = line.split()
        if len(parts) >= 3 and real.startswith(parts[1]) and len(parts[1]) > len(best):
            best, fstype = parts[1], f"{parts[2]} on {parts[0]} ({parts[1]})"
    return fstype


def _run_case(name: str, spec: dict, timeout: int) -> dict:
    default_allocator = name.split("-", 1)[0] in DEFAULT_ALLOCATOR_WORKLOADS
    env = {**os.environ} if default_allocator else {**os.environ, **WORKER_ENV}
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "bench.worker", json.dumps(spec)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"case": name, "error": f"timed out after {timeout} s"}
    wall = time.perf_counter() - t0
    for line in proc.stdout.splitlines():
        if line.startswith(MARKER):
            result = json.loads(line[len(MARKER) :])
            result["process_wall_s"] = wall
            return result
    return {"case": name, "error": f"worker exited {proc.returncode} without a result"}


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.list:
        print("\n".join(case_names()))
        return 0
    mode = "quick" if args.quick else "full"
    names = _selected(args.only)
    if not names:
        print(f"no case matches {args.only}; see --list", file=sys.stderr)
        return 2
    free = shutil.disk_usage(args.tmp).free
    if free < DISK_NEEDED[mode]:
        print(
            f"{args.tmp} has {free >> 20} MiB free, {DISK_NEEDED[mode] >> 20} needed",
            file=sys.stderr,
        )
        return 2

    started = dt.datetime.now()
    t0 = time.perf_counter()
    load_before = os.getloadavg()
    scratch = tempfile.mkdtemp(prefix="tlckpt-bench-", dir=args.tmp)
    results = []
    try:
        for k, name in enumerate(names, 1):
            workload = CASES[name].workload
            reps = args.reps or REPS[mode][workload]
            folder = os.path.join(scratch, name)
            os.mkdir(folder)
            spec = {
                "case": name,
                "mode": mode,
                "reps": reps,
                "warmup": WARMUP,
                "folder": folder,
            }
            print(f"[{k}/{len(names)}] {name} (reps={reps})", file=sys.stderr, flush=True)
            result = _run_case(name, spec, CASE_TIMEOUT_S[mode])
            shutil.rmtree(folder, ignore_errors=True)
            if "error" in result:
                print(f"  {name}: {result['error']}", file=sys.stderr, flush=True)
            results.append(result)
        machine = _machine(scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    wall = time.perf_counter() - t0

    from bench.workloads import SIZES

    command = "python -m bench" + "".join(f" {shlex.quote(a)}" for a in (argv or sys.argv[1:]))
    report = {
        "meta": {
            "started": started.isoformat(timespec="seconds"),
            "mode": mode,
            "command": command,
            "wall_s": wall,
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
            "sizes": SIZES[mode].as_dict(),
            "reps": {w: args.reps or r for w, r in REPS[mode].items()},
            "warmup": WARMUP,
            "worker_env": WORKER_ENV,
            "machine": machine,
        },
        "cases": results,
    }
    stem = started.date().isoformat() + ("-quick" if args.quick else "")
    if args.only:
        stem += "-partial"
    args.out.mkdir(parents=True, exist_ok=True)
    json_path = args.out / f"{stem}.json"
    json_path.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    md_path, png_path = write_reports(report, args.out / stem)
    print(f"wall {wall:.1f} s; wrote {json_path}, {md_path}, {png_path}", file=sys.stderr)
    return 1 if any("error" in r for r in results) else 0

"""Coverage-guided fuzzing of the readers with atheris (libFuzzer).

Run from the repository root::

    python -m fuzz.atheris_run --minutes 3              # every target, 3 minutes each
    python -m fuzz.atheris_run --target adam --minutes 3
    python -m fuzz.atheris_run --runs 2000              # every target, a fixed run count (CI)
    python -m fuzz.atheris_run --line-coverage          # replay the corpora under coverage.py
    python -m fuzz.atheris_run --target json --reproduce fuzz/out/atheris/json/crash-...

Targets: ``adam``, ``tlsf32``, ``json``, ``tlckopt``, ``inspect`` (see :mod:`fuzz.atheris_targets`).
Each target runs in its own process (libFuzzer exits the process when it stops). The corpus
grows in ``fuzz/out/atheris/<target>/corpus`` (seeded from the vectors and small generated
files); crashes, timeouts and out-of-memory inputs are written to
``fuzz/out/atheris/<target>/`` as ``crash-*``, ``timeout-*``, ``oom-*``. libFuzzer limits:
``-timeout=10`` s per input, ``-rss_limit_mb=2048``, ``-max_len=16384``.

Figures printed per target: executions, libFuzzer's edge coverage (``cov``) and features
(``ft``), corpus size, and the number of crash/timeout/oom artifacts. ``--line-coverage``
replays every corpus through the uninstrumented readers under coverage.py and prints the
line coverage of ``codec/`` and ``formats/`` (needs the ``coverage`` package).

Exit status: 0 if no target produced an artifact, else 1.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

from .atheris_targets import MAX_LEN, TARGETS
from .command import campaign_parser, exit_with

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "fuzz" / "out" / "atheris"


def _dirs(out: Path, target: str) -> tuple[Path, Path, Path]:
    base = out / target
    return base, base / "corpus", base / "seeds"


def _write_seeds(seed_dir: Path, target: str) -> int:
    import hashlib

    from .atheris_targets import corpus

    seed_dir.mkdir(parents=True, exist_ok=True)
    entries = corpus(target)
    for data in entries:
        (seed_dir / hashlib.sha1(data).hexdigest()).write_bytes(data)
    return len(entries)


def _fuzz_in_process(args: argparse.Namespace) -> None:
    """Run one target under libFuzzer in this process (does not return)."""
    import atheris

    out = Path(args.out)
    base, corpus_dir, seed_dir = _dirs(out, args.target)
    corpus_dir.mkdir(parents=True, exist_ok=True)
    with atheris.instrument_imports(include=["tlckpt", "construct"]):
        import tlckpt.codec  # noqa: F401 - instrumented here, before anything else imports it
    from .atheris_targets import make_target

    count = _write_seeds(seed_dir, args.target)
    print(f"[{args.target}] {count} seed inputs", flush=True)
    target = make_target(args.target)
    argv = [
        sys.argv[0],
        str(corpus_dir),
        str(seed_dir),
        f"-max_len={MAX_LEN}",
        "-timeout=10",
        "-rss_limit_mb=2048",
        f"-artifact_prefix={base}/",
        "-print_final_stats=1",
        f"-seed={args.seed}",
    ]
    if args.runs is not None:
        argv.append(f"-runs={args.runs}")
    else:
        argv.append(f"-max_total_time={int(args.minutes * 60)}")
    atheris.Setup(argv, target)
    atheris.Fuzz()


_STAT = re.compile(r"^stat::(\w+):\s*(\d+)", re.M)
_DONE = re.compile(r"#(\d+)\s+DONE\s+cov: (\d+) ft: (\d+) corp: (\d+)/(\S+)")
_LAST = re.compile(r"#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+) corp: (\d+)/(\S+)")


def _run_target(target: str, args: argparse.Namespace) -> dict:
    out = Path(args.out)
    base, _, _ = _dirs(out, target)
    before = set(_artifacts(base))
    cmd = [
        sys.executable,
        "-m",
        "fuzz.atheris_run",
        "--in-process",
        "--target",
        target,
        "--out",
        str(out),
        "--seed",
        str(args.seed),
    ]
    cmd += ["--runs", str(args.runs)] if args.runs is not None else ["--minutes", str(args.minutes)]
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    elapsed = time.monotonic() - start
    log = proc.stdout + proc.stderr
    base.mkdir(parents=True, exist_ok=True)
    (base / "last-run.log").write_text(log)
    stats = {k: int(v) for k, v in _STAT.findall(log)}
    done = _DONE.findall(log) or _LAST.findall(log)
    cov = ft = corp = None
    if done:
        _, cov, ft, corp, _ = done[-1]
    new = sorted(set(_artifacts(base)) - before)
    return {
        "target": target,
        "returncode": proc.returncode,
        "seconds": round(elapsed, 1),
        "runs": stats.get("number_of_executed_units"),
        "exec_per_s": stats.get("average_exec_per_sec"),
        "cov": None if cov is None else int(cov),
        "ft": None if ft is None else int(ft),
        "corpus": None if corp is None else int(corp),
        "peak_rss_mb": stats.get("peak_rss_mb"),
        "artifacts": [str(p) for p in new],
        "log": str(base / "last-run.log"),
        "tail": "\n".join(log.strip().splitlines()[-25:]) if proc.returncode else "",
    }


def _artifacts(base: Path) -> list[Path]:
    if not base.is_dir():
        return []
    return [
        p
        for p in base.iterdir()
        if p.name.split("-")[0] in ("crash", "timeout", "oom", "leak", "slow")
    ]


def line_coverage(out: Path) -> dict:
    """Replay every corpus (and seed) input under coverage.py; line coverage of the codec."""
    cmd = [sys.executable, "-m", "fuzz.atheris_run", "--replay", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    print(proc.stdout, end="")
    if proc.returncode:
        print(proc.stderr[-3000:], file=sys.stderr)
    return {"returncode": proc.returncode}


def _replay(out: Path) -> int:
    import coverage

    cov = coverage.Coverage(
        source=[str(REPO / "codec"), str(REPO / "formats")], branch=False, data_file=None
    )
    cov.start()
    from .atheris_targets import corpus, make_target

    inputs = 0
    failures: list[str] = []
    for target in TARGETS:
        fn = make_target(target)
        _, corpus_dir, _ = _dirs(out, target)
        files = sorted(corpus_dir.iterdir()) if corpus_dir.is_dir() else []
        named = [(str(p), p.read_bytes()) for p in files]
        named += [(f"seed corpus entry {k}", d) for k, d in enumerate(corpus(target))]
        for name, data in named:
            inputs += 1
            try:
                fn(data)
            except Exception as exc:  # a crash libFuzzer did not keep: report it
                failures.append(f"[{target}] {name}: {_last_frame(exc)}")
    cov.stop()
    import io as _io

    buf = _io.StringIO()
    total = cov.report(file=buf, show_missing=False)
    print(buf.getvalue())
    print(
        f"replayed {inputs} inputs ({len(failures)} raised a non-CheckpointError or an"
        f" internal error); line coverage of codec/ + formats/: {total:.1f}%"
    )
    for line in failures[:20]:
        print(f"  {line}")
    return 1 if failures else 0


def _last_frame(exc: BaseException) -> str:
    """``Type: message (file:line)`` of the innermost frame, for a one-line report."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    where = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


def _reproduce(target: str, files: list[str]) -> int:
    """Run ``target`` on saved inputs without libFuzzer; print each outcome."""
    import traceback

    from .atheris_targets import make_target

    fn = make_target(target)
    failed = 0
    for name in files:
        try:
            fn(Path(name).read_bytes())
            print(f"{name}: ok (returned or raised a CheckpointError)")
        except Exception:  # what a crash file reproduces: shown with its traceback
            failed += 1
            print(f"{name}: CRASH")
            traceback.print_exc()
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = campaign_parser("atheris_run", __doc__, seed=1)
    parser.add_argument("--target", choices=TARGETS, help="one target (default: all, in turn)")
    parser.add_argument("--minutes", type=float, default=2.0)
    parser.add_argument("--runs", type=int, default=None, help="fixed run count instead")
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument(
        "--line-coverage",
        action="store_true",
        help="after fuzzing, replay the corpora under coverage.py",
    )
    parser.add_argument(
        "--reproduce",
        nargs="+",
        metavar="FILE",
        default=None,
        help="run --target on these inputs (crash files) and show what raises",
    )
    parser.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--replay", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.replay:
        return _replay(Path(args.out))
    if args.reproduce:
        if args.target is None:
            parser.error("--reproduce needs --target")
        return _reproduce(args.target, args.reproduce)
    if args.in_process:
        _fuzz_in_process(args)
        return 0  # pragma: no cover - atheris.Fuzz exits the process
    targets = [args.target] if args.target else list(TARGETS)
    results = []
    for target in targets:
        r = _run_target(target, args)
        results.append(r)
        print(
            f"[{target}] runs={r['runs']} exec/s={r['exec_per_s']} cov={r['cov']} "
            f"ft={r['ft']} corpus={r['corpus']} rss={r['peak_rss_mb']}MB "
            f"time={r['seconds']}s artifacts={len(r['artifacts'])} rc={r['returncode']}",
            flush=True,
        )
        for a in r["artifacts"]:
            print(f"    artifact: {a}")
        if r["tail"]:
            print("    " + r["tail"].replace("\n", "\n    "))
    bad = any(r["artifacts"] or r["returncode"] for r in results)
    if args.line_coverage:
        bad |= line_coverage(Path(args.out))["returncode"] != 0
    return 1 if bad else 0


if __name__ == "__main__":
    exit_with(main)

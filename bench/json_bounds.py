"""Bounded JSON reads: sparse multi-GiB files, and files of a million small tensors.

Run from the repository root::

    .venv/bin/python -m bench.json_bounds              # both tables
    .venv/bin/python -m bench.json_bounds --sparse     # sparse files only
    .venv/bin/python -m bench.json_bounds --many       # a million tensors only

**Sparse files** (4 and 12 GiB, no disk): a JSON document followed by a hole, leading
whitespace past the first-bytes window then a document and a hole, zeros only, a hole then a
document. Each reader (the API's ``read_state_bits``, ``load_state_bits`` and ``inspect``;
the command line's ``inspect``, ``validate``, ``validate --against`` and ``convert``) runs in
its own child process with 2 GiB of address space; the table gives the child's wall time
(process start included; the API call alone in brackets), its peak resident memory and the
outcome. ``--unlimited`` adds the 4 GiB document through ``inspect`` without the limit (the
default cap lets it through: it is read, some 4 GiB of memory).

**A million tensors**: exact-bits float32 files of 10^6 empty and 10^6 one-element tensors,
compact and indented, through ``inspect`` and ``read_state_bits`` (best of three, seconds).
Scripts print figures; no test asserts them.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from tlckpt.codec import inspect, read_state_bits, write_state_bits
from tlckpt.codec.sniffing import HEAD_BYTES
from tlckpt.testing.limits import Child, run_limited, sparse_file

GiB = 1 << 30
LIMIT = 2 * GiB
DOCUMENT = (
    b'{"format": "torchlean_state_float32_bits_v1", "state": [{"shape": [2], "values": [1, 2]}]}'
)
CONTENTS = {
    "JSON, then a hole": (DOCUMENT, b""),
    "spaces past the head, JSON, hole": (b" " * (2 * HEAD_BYTES) + DOCUMENT, b""),
    "zeros": (b"", b""),
    "a hole, then JSON": (b"", DOCUMENT),
}
API = ("read_state_bits", "load_state_bits", "inspect")
CLI = ("inspect", "validate", "validate --against", "convert")


def _cli_argv(command: str, path: Path) -> list[str]:
    argv = [sys.executable, "-m", "tlckpt", command.split()[0], str(path)]
    if command == "validate --against":
        argv += ["--against", str(path.parent / "destination.json")]
    if command == "convert":
        argv.append(str(path.parent / "out.tlsf32"))
    return argv


def _outcome(child: Child, api: bool) -> tuple[str, str]:
    if api:
        result = json.loads(child.stdout.splitlines()[-1])
        return result["outcome"], f" ({result['seconds'] * 1e3:.2f} ms)"
    text = child.stderr.strip() or child.stdout.strip()
    return f"exit {child.returncode}: {text}", ""


def _short(outcome: str, width: int = 110) -> str:
    outcome = outcome.replace(str(Path(tempfile.gettempdir())), "$TMP")
    return outcome if len(outcome) <= width else outcome[: width - 3] + "..."


def sparse_table(folder: Path, unlimited: bool) -> None:
    (folder / "destination.json").write_text(
        '{"kind": "state_bits", "encoding": "float32", "shapes": [[1024, 1024]]}'
    )
    print(f"Sparse files: each reader in a child with {LIMIT / GiB:.0f} GiB of address space")
    print(f"{'file':>44}  {'reader':<24} {'time':>22} {'peak RSS':>9}  outcome")
    for gib in (4, 12):
        for name, (head, tail) in CONTENTS.items():
            path = sparse_file(
                folder / f"{gib}g-{len(head)}-{len(tail)}.json", gib * GiB, head, tail
            )
            label = f"{gib} GiB: {name}"
            runs = [
                (f"API {e}", [sys.executable, "-m", "tlckpt.testing.limits", f"{e}:{path}"], True)
                for e in API
            ]
            runs += [(f"CLI {c}", _cli_argv(c, path), False) for c in CLI]
            for reader, argv, api in runs:
                child = run_limited(argv, LIMIT)
                outcome, call = _outcome(child, api)
                timing = f"{child.seconds:.2f} s{call}"
                print(
                    f"{label:>44}  {reader:<24} {timing:>22} {child.max_rss / 2**20:6.0f} MiB"
                    f"  {_short(outcome)}"
                )
            path.unlink()
    if unlimited:
        path = sparse_file(folder / "4g-unlimited.json", 4 * GiB, DOCUMENT)
        child = run_limited(
            [sys.executable, "-m", "tlckpt.testing.limits", f"inspect:{path}"], 1 << 62
        )
        outcome, call = _outcome(child, True)
        timing = f"{child.seconds:.2f} s{call}"
        label = "4 GiB: JSON, then a hole (no limit)"
        print(
            f"{label:>44}  {'API inspect':<24} {timing:>22} {child.max_rss / 2**20:6.0f} MiB"
            f"  {_short(outcome)}"
        )
        path.unlink()


def _best(call, reps: int = 3) -> float:  # type: ignore[no-untyped-def]
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best


def many_table(folder: Path) -> None:
    print("A million float32 tensors: inspect and read_state_bits, best of 3 (s)")
    print(f"{'file':<36} {'bytes':>12} {'inspect':>8} {'read':>8}")
    for elements in (0, 1):
        for pretty in (False, True):
            path = folder / f"many-{elements}-{pretty}.json"
            arrays = [np.ones(elements, np.float32)] * 10**6
            write_state_bits(path, arrays, "float32", pretty=pretty)
            shapes = [(elements,)] * 10**6
            t_inspect = _best(lambda: inspect(path))  # noqa: B023
            t_read = _best(lambda: read_state_bits(path, shapes, "float32"))  # noqa: B023
            name = f"10^6 x {elements} element(s), {'indented' if pretty else 'compact'}"
            print(f"{name:<36} {path.stat().st_size:>12,} {t_inspect:>8.2f} {t_read:>8.2f}")
            path.unlink()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sparse", action="store_true", help="the sparse-file table only")
    parser.add_argument("--many", action="store_true", help="the million-tensor table only")
    parser.add_argument(
        "--unlimited", action="store_true", help="also inspect a 4 GiB document without a limit"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tlckpt-json-bounds-") as tmp:
        folder = Path(tmp)
        if not args.many:
            sparse_table(folder, args.unlimited)
        if not args.sparse:
            many_table(folder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

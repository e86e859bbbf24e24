"""Two processes saving to the same path at once; a third reading it all the while.

Run from the repository root::

    python -m fuzz.concurrent_save --rounds 200

Two writer processes hold different contents (about ``--size-mb`` MiB each) and, in every
round, are released together to write the same destination: ``write_float32_state`` in even
rounds, ``write_adam`` in odd ones. After each round the destination must be exactly one
writer's complete file (its bytes equal one of the two expected images, and the library reads
it fully), and the folder must hold nothing else (no temporary left behind). A reader process
keeps opening and reading the destination during the rounds; every file it sees must be one of
the complete images (the initial one, or a writer's). The writers report their start and end
times, so the number of rounds whose writes really overlapped is printed too.

Exit status: 0 if every round ended in one complete file with no leftovers and every
concurrent read saw a complete file, else 1.
"""

from __future__ import annotations

import hashlib
import io
import multiprocessing as mp
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from .command import add_folder_options, campaign_parser, exit_with, run_in_folder


def _contents(writer: int, size_mb: float) -> dict[str, Any]:
    from tlckpt.codec import AdamConfig, AdamEntry, AdamKind, ParameterSchema

    rng = np.random.default_rng(100 + writer)
    n = max(1, int(size_mb * (1 << 20) / 4 / 2))
    arrays = [
        rng.standard_normal(n).astype("<f4"),
        rng.standard_normal((n // 1000, 1000)).astype("<f4"),
    ]
    schema = ParameterSchema([(n,), (n,)], [True, True], [0, 0])
    config = AdamConfig(AdamKind.ADAMW, 0.9, 0.999, 1e-8, 0.01)
    entries = {
        0: AdamEntry(writer + 1, rng.standard_normal(n).astype("<f4"), rng.random(n).astype("<f4"))
    }
    return {"arrays": arrays, "schema": schema, "config": config, "entries": entries}


def _write(c: dict[str, Any], target: Any, fmt: str) -> None:
    from tlckpt.codec import write_adam, write_float32_state

    if fmt == "tlsf32":
        write_float32_state(target, c["arrays"])
    else:
        write_adam(target, c["schema"], c["config"], c["entries"])


def _image(c: dict[str, Any], fmt: str) -> bytes:
    buf = io.BytesIO()
    _write(c, buf, fmt)
    return buf.getvalue()


def _writer(conn: Any, index: int, dest: str, size_mb: float) -> None:
    from tlckpt.codec.fileio.retired import wait_for_releases

    contents = _contents(index, size_mb)
    conn.send("ready")
    while True:
        msg = conn.recv()
        if msg is None:
            return
        start = time.monotonic()
        try:
            _write(contents, dest, msg)
            error = None
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        end = time.monotonic()
        # A save over a large file frees the old one on a thread after returning (its second
        # name a locked temporary until then): wait for it, so that the round's listing
        # sees what the saves leave for good.
        wait_for_releases()
        conn.send((start, end, error))


def _reader(conn: Any, dest: str, known: set[str]) -> None:
    reads = bad = 0
    examples: list[str] = []
    while not conn.poll():
        try:
            with open(dest, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            continue
        reads += 1
        digest = hashlib.sha256(data).hexdigest()
        if digest not in known:
            bad += 1
            if len(examples) < 5:
                examples.append(f"{len(data)} bytes, sha256 {digest[:16]}")
    conn.send((reads, bad, examples))


def run(rounds: int, size_mb: float, folder: Path) -> dict[str, Any]:
    from tlckpt.codec import inspect

    ctx = mp.get_context("fork")
    dest = folder / "shared.ckpt"
    contents = [_contents(i, size_mb) for i in (0, 1)]
    images = {fmt: [_image(c, fmt) for c in contents] for fmt in ("tlsf32", "adam")}
    initial = _image(_contents(7, size_mb / 4), "tlsf32")
    dest.write_bytes(initial)
    known = {hashlib.sha256(b).hexdigest() for imgs in images.values() for b in imgs}
    known.add(hashlib.sha256(initial).hexdigest())
    writers = []
    for i in (0, 1):
        parent, child = ctx.Pipe()
        p = ctx.Process(target=_writer, args=(child, i, str(dest), size_mb), daemon=True)
        p.start()
        child.close()
        if parent.recv() != "ready":
            raise RuntimeError("writer did not start")
        writers.append((p, parent))
    rparent, rchild = ctx.Pipe()
    reader = ctx.Process(target=_reader, args=(rchild, str(dest), known), daemon=True)
    reader.start()
    rchild.close()
    winners = {0: 0, 1: 0}
    overlapped = 0
    failures: list[str] = []
    for r in range(rounds):
        fmt = "tlsf32" if r % 2 == 0 else "adam"
        for _, conn in writers:
            conn.send(fmt)
        spans = [conn.recv() for _, conn in writers]
        for i, (_, _, error) in enumerate(spans):
            if error:
                failures.append(f"round {r}: writer {i} raised {error}")
        (s0, e0, _), (s1, e1, _) = spans
        overlapped += s0 < e1 and s1 < e0
        data = dest.read_bytes()
        if data == images[fmt][0]:
            winners[0] += 1
        elif data == images[fmt][1]:
            winners[1] += 1
        else:
            failures.append(f"round {r}: destination is neither writer's file ({len(data)} B)")
        try:
            inspect(dest)
        except Exception as exc:
            failures.append(f"round {r}: inspect failed: {exc}")
        extra = sorted(set(os.listdir(folder)) - {dest.name})
        if extra:
            failures.append(f"round {r}: left in the folder: {extra}")
    for p, conn in writers:
        conn.send(None)
        p.join(timeout=10)
    rparent.send("stop")
    reads, bad, examples = rparent.recv()
    reader.join(timeout=10)
    if bad:
        failures.append(f"concurrent reader saw {bad} incomplete file(s): {examples}")
    return {
        "rounds": rounds,
        "size_mb": size_mb,
        "overlapping_rounds": overlapped,
        "winner_counts": winners,
        "concurrent_reads": reads,
        "incomplete_reads": bad,
        "failures": failures,
    }


def main(argv: list[str] | None = None) -> int:
    parser = campaign_parser("concurrent_save", __doc__)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--size-mb", type=float, default=4.0)
    add_folder_options(parser, quiet=False)
    args = parser.parse_args(argv)
    report = run_in_folder(
        "tlckpt-concurrent-", args.dir, lambda folder: run(args.rounds, args.size_mb, folder)
    )
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    exit_with(main)

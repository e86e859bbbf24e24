"""Mutation campaign: every seed mutated systematically, then at random, within bounds.

Run from the repository root::

    python -m fuzz.mutate --minutes 10          # systematic set, then random until 10 min
    python -m fuzz.mutate --systematic-only     # exactly the systematic set, no time limit
    python -m fuzz.mutate --quick               # the CI sample (a few thousand cases)
    python -m fuzz.mutate --random-only --minutes 10   # random stacked mutations only
    python -m fuzz.mutate --inputs 1000000      # systematic set, then random up to 10^6 inputs

Seeds are every conformance vector (``<repo>/tests/vectors``) and larger generated files
of every format and version (:mod:`fuzz.seeds`). Each mutated input is read by the seed's
destination reader (``read_adam`` / ``read_float32_state`` / ``read_state_bits`` with the
destination the manifest gives) and by ``inspect``. Every read must end in success or a
``CheckpointError``, within 1 s and 64 MiB of peak growth (traced allocations and peak RSS,
see :mod:`fuzz.bounds`) for an input of at most 1 MiB (the few larger inputs get the bounds
scaled per started MiB).

Record-level mutations (records duplicated, deleted, swapped, overwritten; see
:func:`fuzz.mutators.record_mutation`) run in both phases and are counted apart per format.
In the random phase a seed is picked with a weight inverse to what one of its inputs costs
(:func:`seed_weights`: each seed gets about the same share of the time), so that the few
1 MiB max-record seeds, whose reads cost a thousand times those of a vector, do not take
most of it.

Cases run in forked worker processes (batches of cases per worker), so that a hang or a
crash is caught (the parent kills a worker that makes no progress for ``--hang-seconds``),
memory is measured per case, and the address space of a worker is capped (a runaway allocation fails
there as a ``MemoryError``, recorded as an escape). Escapes and bound violations are saved
under ``--out`` (``fuzz/out/mutate`` by default) with the seed, mutation and traceback.

Exit status: 0 if there was no escape and no bound violation, else 1.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing as mp
import random
import sys
import time
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

from .bounds import MiB, limit_address_space, measure, retime
from .command import campaign_parser, exit_with
from .mutate_report import Campaign, campaign_report, print_report
from .mutators import apply, field_map, random_specs, record_kind, systematic
from .seeds import REPO, Seed, all_seeds, generated_seeds, readers, vector_seeds

DEFAULT_OUT = REPO / "fuzz" / "out" / "mutate"

# ------------------------------------------------------------------------------ worker


def _worker(conn: Any, progress: Any, seeds: list[Seed], address_space: int) -> None:
    limit_address_space(address_space)
    tracemalloc.start()
    by_seed: dict[int, list] = {}
    cache: dict = {}
    while True:
        batch = conn.recv()
        if batch is None:
            return
        results = []
        for case_id, seed_idx, spec in batch:
            progress.value = case_id
            seed = seeds[seed_idx]
            data = apply(seed.data, spec, cache)
            if seed_idx not in by_seed:
                by_seed[seed_idx] = readers(seed)
            outcomes = [measure(label, fn, data) for label, fn in by_seed[seed_idx]]
            bad = any(o.status == "escape" or o.bound_violations(len(data)) for o in outcomes)
            results.append((case_id, len(data), outcomes, data if bad else None))
        conn.send(results)


@dataclass
class _Worker:
    process: Any
    conn: Any
    progress: Any
    batch: list = field(default_factory=list)
    last_progress: int = -1
    last_change: float = 0.0


# ------------------------------------------------------------------------------ scheduling


def _seed_streams(seeds: list[Seed], quick: int | None, rng: random.Random) -> list[Iterator]:
    streams = []
    for i, seed in enumerate(seeds):
        if seed.origin == "crafted":  # slow to map on purpose: read as is, cut, extended
            n = len(seed.data)
            streams.append(iter([("none",), ("trunc", n - 1), ("replace", n, n, b"\0")]))
            continue
        specs = systematic(seed.data, seed.binary, seed=i)
        if quick is not None and seed.origin != "vector":
            cap = max(1, quick // 10)
        elif quick is not None:
            cap = min(quick, seed.cap or quick)
        else:
            cap = seed.cap
        if cap is not None:
            specs_list = list(specs)
            # A third of a capped sample is record-level mutations where the seed has them
            # (a uniform sample of a large seed's set holds almost none).
            records = [x for x in specs_list[1:] if record_kind(x) is not None]
            others = [x for x in specs_list[1:] if record_kind(x) is None]
            picked = rng.sample(records, min(len(records), max(1, cap // 3)))
            picked += rng.sample(others, min(cap - len(picked), len(others)))
            specs = iter(specs_list[:1] + picked)
        streams.append(specs)
    return streams


def _schedule(seeds: list[Seed], streams: list[Iterator], chunk: int) -> Iterator[tuple]:
    """Round-robin over the seeds' systematic streams, ``chunk`` specs at a time."""
    live = list(range(len(seeds)))
    while live:
        for i in list(live):
            stream = streams[i]
            for _ in range(chunk if len(seeds[i].data) <= 65536 else max(1, chunk // 10)):
                try:
                    yield i, next(stream)
                except StopIteration:
                    live.remove(i)
                    break


#: Seconds an input costs whatever its seed: applying the mutation, the measurements, pipes.
PER_INPUT_OVERHEAD_S = 0.002


def seed_weights(seeds: list[Seed]) -> list[float]:
    """The random phase's weights: the inverse of what one input of each seed costs.

    The cost is the time the seed's readers take on the unmutated file (untraced, best of
    two) plus :data:`PER_INPUT_OVERHEAD_S`, so that each seed gets about the same share of
    the time. Picked uniformly, the three 1 MiB max-record seeds (about a second per read,
    a thousand times a vector's) took 85 % of the random phase.
    """
    weights = []
    for seed in seeds:
        cost = sum(retime(fn, seed.data, runs=2) for _, fn in readers(seed))
        weights.append(1.0 / (PER_INPUT_OVERHEAD_S + cost))
    return weights


def _random_phase(seeds: list[Seed], rng: random.Random) -> Iterator[tuple]:
    maps = {i: field_map(s.data) if s.binary else None for i, s in enumerate(seeds)}
    indices = range(len(seeds))
    cum_weights = list(itertools.accumulate(seed_weights(seeds)))
    while True:
        (i,) = rng.choices(indices, cum_weights=cum_weights)
        yield i, random_specs(seeds[i].data, seeds[i].binary, rng, maps[i])


# ------------------------------------------------------------------------------ driver


def run(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    if args.vectors_only:
        seeds = vector_seeds()
    elif args.quick:  # CI: no max-record or crafted seeds (slow by design; own tests)
        seeds = vector_seeds() + generated_seeds()
    else:
        seeds = all_seeds()
    if args.seeds:
        seeds = [s for s in seeds if args.seeds in s.name]
    if args.exclude:
        seeds = [s for s in seeds if args.exclude not in s.name]
    if not seeds:
        print("no seeds selected", file=sys.stderr)
        return 2
    out = Path(args.out)
    campaign = Campaign(seeds, out)
    rng = random.Random(args.random_seed)
    quick = args.quick_per_seed if args.quick else None
    streams = [] if args.random_only else _seed_streams(seeds, quick, rng)
    source = _schedule(seeds, streams, chunk=50)
    if args.random_only:
        source = iter(())  # the systematic phase ends at once
    deadline = None if args.minutes is None else t0 + 60 * args.minutes
    phase = "systematic"
    systematic_done = False

    ctx = mp.get_context("fork")
    workers: list[_Worker] = []

    def spawn() -> _Worker:
        parent, child = ctx.Pipe()
        progress = ctx.Value("q", -1, lock=False)
        p = ctx.Process(
            target=_worker, args=(child, progress, seeds, args.address_space * MiB), daemon=True
        )
        p.start()
        child.close()
        return _Worker(p, parent, progress, last_change=time.monotonic())

    for _ in range(args.jobs):
        workers.append(spawn())

    next_id = 0
    exhausted = False

    def fill(w: _Worker) -> None:
        nonlocal next_id, exhausted, source, phase, systematic_done
        batch = []
        budget = 0
        while budget < args.batch_bytes and len(batch) < 200 and not exhausted:
            if deadline is not None and time.monotonic() > deadline:
                exhausted = True
                break
            if args.inputs is not None and next_id >= args.inputs:
                exhausted = True
                break
            try:
                seed_idx, spec = next(source)
            except StopIteration:
                if phase == "systematic":
                    systematic_done = not args.random_only
                    unbounded = deadline is None and args.inputs is None
                    if args.systematic_only or args.quick or unbounded:
                        exhausted = True
                        break
                    phase = "random"
                    source = _random_phase(seeds, rng)
                    continue
                exhausted = True
                break
            campaign.cases[next_id] = (seed_idx, spec, phase == "random")
            batch.append((next_id, seed_idx, spec))
            budget += len(seeds[seed_idx].data) + 2000
            next_id += 1
        w.batch = batch
        w.last_change = time.monotonic()
        if batch:
            w.conn.send(batch)

    for w in workers:
        fill(w)
    interrupted = False
    try:
        _drive(workers, campaign, spawn, fill, args, t0, lambda: phase)
    except KeyboardInterrupt:  # Ctrl-C: stop, and still report what ran
        interrupted = True
        for w in workers:
            w.process.kill()
    for w in workers:
        if w.process.is_alive():
            w.conn.send(None)
        w.process.join(timeout=5)
        if w.process.is_alive():
            w.process.kill()
    if not interrupted:
        campaign.confirm_times()
    elapsed = time.monotonic() - t0
    report = campaign_report(campaign, elapsed, systematic_done, phase, args)
    report["interrupted"] = interrupted
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str))
    print_report(report, campaign)
    bad = report["totals"]["escapes"] + report["totals"]["violations"]
    return 1 if bad else 0


def _drive(workers, campaign, spawn, fill, args, t0, phase) -> None:
    """Collect results, refill workers, replace hung or dead ones, until no batch is out."""
    last_report = time.monotonic()
    while any(w.batch for w in workers):
        ready = wait([w.conn for w in workers if w.batch], timeout=1.0)
        now = time.monotonic()
        for w in list(workers):
            if not w.batch:
                continue
            if w.conn in ready:
                try:
                    results = w.conn.recv()
                except (EOFError, ConnectionResetError):
                    results = None
                if results is not None:
                    for case_id, size, outcomes, data in results:
                        campaign.record(case_id, size, outcomes, data)
                    fill(w)
                    continue
                # The worker died (segfault, OOM kill): blame the case it was on.
                _replace(w, campaign, workers, spawn, "crash", now, fill)
                continue
            current = w.progress.value
            if current != w.last_progress:
                w.last_progress, w.last_change = current, now
            elif now - w.last_change > args.hang_seconds:
                _replace(w, campaign, workers, spawn, "hang", now, fill)
        if now - last_report > 30 and not args.quiet:
            stats = campaign.stats.values()
            done = sum(s.inputs for s in stats)
            records = sum(s.record_mutations for s in stats)
            escapes = sum(s.escapes for s in stats)
            print(
                f"  ... {done} inputs ({records} record-level), {escapes} escapes,"
                f" {now - t0:.0f} s, {done / max(now - t0, 1e-9):.0f}/s, phase {phase()}",
                flush=True,
            )
            last_report = now


def _replace(w, campaign, workers, spawn, what, now, fill) -> None:
    """Kill a stuck or dead worker, blame its current case, resubmit the rest."""
    current = w.progress.value
    if w.process.is_alive():
        w.process.kill()
    w.process.join(timeout=5)
    pending = [c for c in w.batch if c[0] in campaign.cases]
    if any(c[0] == current for c in pending):
        blamed = current
    else:
        blamed = pending[0][0] if pending else None
    if blamed is not None:
        campaign.hang(blamed, what, now - w.last_change)
    rest = [c for c in pending if c[0] != blamed]
    workers.remove(w)
    fresh = spawn()
    workers.append(fresh)
    if rest:
        fresh.batch = rest
        fresh.conn.send(rest)
    else:
        fill(fresh)


def main(argv: list[str] | None = None) -> int:
    parser = campaign_parser("mutate", __doc__)
    parser.add_argument(
        "--minutes",
        type=float,
        default=None,
        help="time budget; after the systematic set, random mutations fill it",
    )
    parser.add_argument(
        "--inputs",
        type=int,
        default=None,
        help="stop after this many inputs (the systematic set, then random ones); with"
        " --minutes, whichever comes first",
    )
    parser.add_argument(
        "--systematic-only", action="store_true", help="stop after the systematic set"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="CI sample: --quick-per-seed random systematic cases per seed",
    )
    parser.add_argument(
        "--quick-per-seed",
        type=int,
        default=30,
        help="cases per vector seed in --quick (a tenth per generated seed)",
    )
    parser.add_argument(
        "--random-only",
        action="store_true",
        help="skip the systematic set: random stacked mutations for --minutes",
    )
    parser.add_argument("--vectors-only", action="store_true", help="only the vectors as seeds")
    parser.add_argument("--seeds", default=None, help="only seeds whose name contains this")
    parser.add_argument("--exclude", default=None, help="no seeds whose name contains this")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument("--hang-seconds", type=float, default=60.0)
    parser.add_argument(
        "--address-space",
        type=int,
        default=3072,
        help="MiB a worker may map beyond its start (default 3072)",
    )
    parser.add_argument("--batch-bytes", type=int, default=8 * MiB)
    parser.add_argument("--random-seed", type=int, default=6)
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    if args.minutes is None and args.inputs is None and not (args.systematic_only or args.quick):
        args.minutes = 10.0
    return run(args)


if __name__ == "__main__":
    exit_with(main)

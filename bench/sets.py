"""Checkpoint sets against their goals: verified restore, digests, background saves.

    .venv/bin/python -m bench.sets [--mib 256] [--reps 5] [--tmp DIR] [--threads N]

Prints, for a float32 model of ``--mib`` MiB (16 tensors) with AdamW state (its moments are
twice that again), the median of ``--reps`` runs of:

* verified restore (``CheckpointManager.restore``: the staged loads read the members
  through digesting readers, the digests are compared, then one commit) against the
  unverified staged loads of the same member files (``load_module_state`` +
  ``load_optimizer``, one after the other) — goal ≤ 1.3x; and against the same restore with
  the hashing switched off (all members staged at once before the one commit: the cost of
  all-or-nothing is in both, the ratio is the cost of verifying);
* a blocking set save with digests against the same save with the digest switched off (the
  same protocol, members, fsyncs and rename) — goal ≤ 1.1x;
* the ``save(..., blocking=False)`` call against a blocking save of the model's state alone
  (``--mib`` MiB) — goal ≤ 0.3x, target one memcpy of the state (printed too);
* a training loop's steps per second while a background save of the model and its
  optimizer proceeds, against the same loop idle between the saves (medians) — goal ≥ 80%;
  and a pure-Python loop's iterations per second in the same two situations;
* signed against unsigned sets (``key=``: members digested with keyed BLAKE3 while they are
  written, the manifest MAC'd) of the ``--mib`` MiB model alone: a blocking
  ``save_checkpoint``, ``verify_checkpoint`` and ``load_checkpoint``, repetitions
  alternating, ``os.sync()`` before each — save goal ≤ 1.15x;
* the GIL probe: the pure-Python loop idle, while the writer runs as this process's thread
  (at its lowered priority), and while the same saves run in another process (at normal
  priority). A writer thread that held the GIL would cost the loop more than the process
  does; what both cost otherwise is the machine's cores.

Page cache warm (each timed operation runs once untimed first). Ratios are of medians from
one run. A figure-printing script, not a test.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

import tlckpt
from tlckpt.codec.sets import checkpoint_set


def _model(mib: int) -> torch.nn.ParameterList:
    total = mib * 2**20 // 4
    per = total // 16
    torch.manual_seed(0)
    return torch.nn.ParameterList(torch.nn.Parameter(torch.randn(per)) for _ in range(16))


def _optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    return opt


def _median(fn: Callable[[], object], reps: int) -> float:
    times = []
    for k in range(reps + 1):
        start = time.perf_counter()
        fn()
        if k:  # the first run warms the page cache and the allocator
            times.append(time.perf_counter() - start)
    return statistics.median(times)


class _NoDigest:
    """Stands in for the hash: the same writes, no digest."""

    def update(self, data: object) -> None:
        pass

    def hexdigest(self) -> str:
        return "0" * 32


def _alternating(ways: dict[str, Callable[[], object]], reps: int) -> dict[str, float]:
    """Median seconds of each way; repetitions alternate, so that drift spreads over all."""
    times: dict[str, list[float]] = {label: [] for label in ways}
    for k in range(reps + 1):
        for label, way in ways.items():
            start = time.perf_counter()
            way()
            if k:  # the first round warms the page cache and the allocator
                times[label].append(time.perf_counter() - start)
    return {label: statistics.median(t) for label, t in times.items()}


def _restore(folder: Path, model, opt, reps: int) -> None:
    manager = tlckpt.CheckpointManager(folder)
    manager.save(1, model=model, optimizer=opt)
    member = folder / "step-00000000000000000001"
    reader = checkpoint_set.DigestingReader
    real = reader._consume, reader.finish, checkpoint_set._compare

    def undigested() -> None:
        """The same restore (all members staged, then one commit) with no hashing at all."""
        reader._consume = lambda self, start, view: None  # type: ignore[method-assign]
        reader.finish = lambda self: ("", 0)  # type: ignore[method-assign]
        checkpoint_set._compare = lambda *args: None
        try:
            manager.restore(model=model, optimizer=opt)
        finally:
            reader._consume, reader.finish, checkpoint_set._compare = real  # type: ignore[method-assign]

    medians = _alternating(
        {
            "verified": lambda: manager.restore(model=model, optimizer=opt),
            "unverified": lambda: (
                tlckpt.load_module_state(model, member / "model.tlsf32"),
                tlckpt.load_optimizer(opt, model, member / "optimizer.tladam"),
            ),
            "undigested": undigested,
        },
        reps,
    )
    verified, unverified = medians["verified"], medians["unverified"]
    undigested_time = medians["undigested"]
    print(
        f"restore      verified {verified * 1e3:8.1f} ms   unverified loads"
        f" {unverified * 1e3:8.1f} ms   ratio {verified / unverified:.2f}  (goal <= 1.3)"
        f"   same restore without digests {undigested_time * 1e3:.1f} ms"
        f" (ratio {verified / undigested_time:.2f})"
    )


def _digests(folder: Path, model, opt, reps: int) -> None:
    step = iter(range(10**6))
    manager = tlckpt.CheckpointManager(folder, keep_last=1)
    writer = checkpoint_set.DigestingWriter
    real_init = writer.__init__

    def without_digest(self, file, key=None) -> None:  # the members' digests only
        real_init(self, file, key)
        self.hash = _NoDigest()

    times: dict[bool, list[float]] = {True: [], False: []}
    for k in range(reps + 1):
        for digest in (True, False):  # alternating: the disk's drift spreads over both
            writer.__init__ = real_init if digest else without_digest  # type: ignore[method-assign]
            try:
                start = time.perf_counter()
                manager.save(next(step), model=model, optimizer=opt)
                if k:
                    times[digest].append(time.perf_counter() - start)
            finally:
                writer.__init__ = real_init  # type: ignore[method-assign]
    with_digest, without = statistics.median(times[True]), statistics.median(times[False])
    print(
        f"save         digests {with_digest * 1e3:8.1f} ms   no digests"
        f" {without * 1e3:8.1f} ms   ratio {with_digest / without:.2f}  (goal <= 1.1)"
    )


def _signed(folder: Path, model: torch.nn.Module, reps: int) -> None:
    """Signed against unsigned: save, verify and restore of the model alone, alternating."""
    folder.mkdir()
    keys = {"unsigned": None, "signed": os.urandom(32)}
    ops = ("save", "verify", "restore")
    times: dict[tuple[str, str], list[float]] = {(op, label): [] for op in ops for label in keys}

    def one_round(label: str, key: bytes | None, timed: bool) -> None:
        target = folder / label
        shutil.rmtree(target, ignore_errors=True)  # untimed: the save needs a new folder
        calls = {
            "save": lambda: tlckpt.save_checkpoint(target, model=model, key=key),
            "verify": lambda: tlckpt.verify_checkpoint(target, key=key),
            "restore": lambda: tlckpt.load_checkpoint(target, model=model, key=key),
        }
        for op, call in calls.items():
            os.sync()  # the previous call's dirty pages are not this one's to write
            start = time.perf_counter()
            call()
            if timed:  # the first round warms the page cache and the allocator
                times[op, label].append(time.perf_counter() - start)

    for k in range(reps + 1):
        for label, key in keys.items():
            one_round(label, key, k > 0)
    for op in ops:
        plain, signed = (statistics.median(times[op, label]) for label in keys)
        # Each round's two calls ran back to back: the median of their ratios is the
        # figure least moved by a load that drifts (a shared machine).
        paired = statistics.median(
            s / u for u, s in zip(times[op, "unsigned"], times[op, "signed"], strict=True)
        )
        spread = "  ".join(
            f"{label} {min(times[op, label]) * 1e3:.0f}-{max(times[op, label]) * 1e3:.0f}"
            for label in keys
        )
        goal = "  (goal <= 1.15)" if op == "save" else ""
        print(
            f"signed {op:<8} {signed * 1e3:8.1f} ms   unsigned {plain * 1e3:8.1f} ms"
            f"   ratio {signed / plain:.2f}, paired {paired:.2f}{goal}   min-max ms: {spread}"
        )


def _background_call(folder: Path, model, reps: int, mib: int) -> None:
    step = iter(range(10**6))
    manager = tlckpt.CheckpointManager(folder, keep_last=1)
    blocking = _median(lambda: manager.save(next(step), model=model), reps)
    calls = []
    for k in range(reps + 1):
        manager.wait()
        start = time.perf_counter()
        manager.save(next(step), model=model, blocking=False)
        if k:
            calls.append(time.perf_counter() - start)
    manager.wait()
    call = statistics.median(calls)
    copies = [p.detach().clone() for p in model.parameters()]
    pairs = list(zip(copies, model.parameters()))
    memcpy = _median(lambda: [c.copy_(p.detach()) for c, p in pairs], reps)
    print(
        f"background   call {call * 1e3:8.1f} ms   blocking save {blocking * 1e3:8.1f} ms"
        f"   ratio {call / blocking:.2f}  (goal <= 0.3)   one memcpy of {mib} MiB"
        f" {memcpy * 1e3:.1f} ms"
    )


def _rate(work: Callable[[], None], seconds: float) -> float:
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        work()
        count += 1
    return count / (time.perf_counter() - start)


def _contention(folder: Path, model, opt, seconds: float) -> None:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    net_opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    x = torch.randn(64, 256)

    def train_step() -> None:
        net_opt.zero_grad()
        net(x).pow(2).mean().backward()
        net_opt.step()

    def python_step() -> None:
        total = 0
        for i in range(2000):
            total += i * i

    manager = tlckpt.CheckpointManager(folder, keep_last=1)
    step = iter(range(10**6))
    for label, work in (("training loop", train_step), ("pure-Python loop", python_step)):
        idle_rates, rates = [], []
        busy_time = 0.0
        while busy_time < seconds:  # idle and busy stretches alternate: the load drifts
            manager.wait()
            idle_rates.append(_rate(work, 0.25))
            handle = manager.save(next(step), model=model, optimizer=opt, blocking=False)
            count, start = 0, time.perf_counter()
            while not handle.done():
                work()
                count += 1
            elapsed = time.perf_counter() - start
            busy_time += elapsed
            rates.append(count / elapsed)
        idle = statistics.median(idle_rates)
        busy = statistics.median(rates)
        print(
            f"{label:<17} idle {idle:9.1f}/s   during background saves {busy:9.1f}/s"
            f"   kept {busy / idle:.0%}  (goal >= 80%)"
        )
    manager.wait()


_WRITER_PROCESS = """
import sys, torch, tlckpt
from bench.sets import _model, _optimizer
model = _model(int(sys.argv[1])); opt = _optimizer(model)
manager = tlckpt.CheckpointManager(sys.argv[2], keep_last=1)
print("ready", flush=True)
step = 0
while True:
    manager.save(step, model=model, optimizer=opt)
    step += 1
"""


def _gil(folder: Path, model, opt, seconds: float, mib: int) -> None:
    """The pure-Python loop while the same set saves run in a thread of this process and in
    another process: the difference is what the writer thread takes of the GIL (the rest is
    the machine's cores and memory bandwidth, which a process would share as well)."""

    def python_step() -> None:
        total = 0
        for i in range(2000):
            total += i * i

    idle = _rate(python_step, seconds)
    manager = tlckpt.CheckpointManager(folder / "thread", keep_last=1)
    step = iter(range(10**6))
    count, elapsed = 0, 0.0
    while elapsed < seconds:
        manager.wait()
        handle = manager.save(next(step), model=model, optimizer=opt, blocking=False)
        start = time.perf_counter()
        while not handle.done():
            python_step()
            count += 1
        elapsed += time.perf_counter() - start
    manager.wait()
    in_thread = count / elapsed
    env = dict(os.environ, OMP_NUM_THREADS=str(torch.get_num_threads()))
    child = subprocess.Popen(
        [sys.executable, "-c", _WRITER_PROCESS, str(mib), str(folder / "process")],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=Path(__file__).resolve().parents[1],
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        time.sleep(0.5)
        in_process = _rate(python_step, seconds)
    finally:
        child.kill()
        child.wait()
    print(
        f"GIL probe        idle {idle:9.1f}/s   writer thread {in_thread:9.1f}/s"
        f" ({in_thread / idle:.0%})   writer process {in_process:9.1f}/s"
        f" ({in_process / idle:.0%})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--tmp", default=None)
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's)"
    )
    parser.add_argument(
        "--only", choices=("restore", "digests", "signed", "background", "contention", "gil")
    )
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    model = _model(args.mib)
    opt = _optimizer(model)
    print(
        f"{args.mib} MiB float32 model (16 tensors) + AdamW moments, {torch.get_num_threads()}"
        " torch threads"
    )
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        root = Path(tmp)
        if args.only in (None, "restore"):
            _restore(root / "restore", model, opt, args.reps)
        if args.only in (None, "digests"):
            _digests(root / "digests", model, opt, args.reps)
        if args.only in (None, "signed"):
            _signed(root / "signed", model, args.reps)
        if args.only in (None, "background"):
            _background_call(root / "background", model, args.reps, args.mib)
        if args.only in (None, "contention"):
            _contention(root / "contention", model, opt, args.seconds)
        if args.only in (None, "gil"):
            _gil(root / "gil", model, opt, args.seconds, args.mib)


if __name__ == "__main__":
    main()

"""Sparse files, and readers run in child processes under an address-space limit, measured.

How a reader treats a file far larger than memory is tested with sparse files (several GiB
that cost no disk) read in a child process whose address space is capped: a reader that tried
to take such a file into memory then fails at once, harmlessly, instead of exhausting the
machine. The child's time and peak resident memory (``ru_maxrss``) are measured.

``python -m tlckpt.testing.limits ENTRY:FILE ...`` is the child for the library's own readers:
it runs each ``ENTRY`` (:data:`ENTRIES`) on its ``FILE`` and prints one JSON line per pair: the
entry, the file, the outcome (``"ok"`` or the error's class and message) and the seconds the
call took.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["DESTINATION", "ENTRIES", "Child", "run_limited", "run_reader", "sparse_file"]

#: The destination the readers that take one are given: one float32 tensor of 2^20 elements.
DESTINATION = [(1024, 1024)]


def sparse_file(path: str | os.PathLike, size: int, head: bytes = b"", tail: bytes = b"") -> Path:
    """A file of ``size`` bytes: ``head`` at the start, ``tail`` at the end, a hole between.

    The hole reads as zero bytes and takes no disk space on file systems with sparse files.
    """
    with open(path, "wb") as f:
        f.write(head)
        if tail:
            f.seek(size - len(tail))
            f.write(tail)
        f.truncate(size)
    return Path(path)


@dataclass(frozen=True)
class Child:
    """One finished child process."""

    returncode: int
    stdout: str
    stderr: str
    seconds: float  #: wall-clock time, process start included
    max_rss: int  #: peak resident memory in bytes (``ru_maxrss``)


def run_limited(
    argv: Sequence[str],
    address_space: int,
    *,
    timeout: float = 300.0,
    env: dict[str, str] | None = None,
) -> Child:
    """Run ``argv`` with its address space capped at ``address_space`` bytes.

    Args:
        argv: the command.
        address_space: ``RLIMIT_AS`` of the child, in bytes.
        timeout: seconds before the child is killed (its status is then ``-9``).
        env: extra environment variables (one BLAS thread is set, so that thread stacks
            do not eat the address space).

    Returns:
        Its exit status, output, wall time and peak resident memory.
    """

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))

    environment = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    environment.update(env or {})
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(
            list(argv), stdout=out, stderr=err, preexec_fn=limit, env=environment
        )
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        try:
            # wait4, not wait: the child's own peak memory, whatever ran before it.
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        seconds = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return Child(
            proc.returncode,
            out.read().decode(errors="replace"),
            err.read().decode(errors="replace"),
            seconds,
            usage.ru_maxrss * 1024,  # KiB on Linux
        )


# --------------------------------------------------------------------------- the child


def _read_state_bits() -> Callable[[str], Any]:
    from ..codec import read_state_bits

    return lambda path: read_state_bits(path, DESTINATION, "float32")


def _load_state_bits() -> Callable[[str], Any]:
    import torch

    from ..runtime import load_state_bits

    model = [torch.zeros(DESTINATION[0])]
    return lambda path: load_state_bits(model, path)


def _inspect() -> Callable[[str], Any]:
    from ..codec import inspect

    return inspect


#: The readers a child can run, by name: each imports what it needs and returns the call.
ENTRIES: dict[str, Callable[[], Callable[[str], Any]]] = {
    "read_state_bits": _read_state_bits,
    "load_state_bits": _load_state_bits,
    "inspect": _inspect,
}


def run_reader(entry: str, path: str) -> dict[str, Any]:
    """Run one entry on ``path``: ``{"outcome": "ok" | "<Error>: <message>", "seconds"}``.

    The seconds are those of the call alone (imports and the destination come first).
    """
    from ..codec import CheckpointError

    call = ENTRIES[entry]()
    start = time.perf_counter()
    try:
        call(path)
        outcome = "ok"
    except (CheckpointError, OSError) as exc:
        outcome = f"{type(exc).__name__}: {exc}"
    except MemoryError:  # the failure the readers must never let out
        outcome = "MemoryError"
    return {"outcome": outcome, "seconds": time.perf_counter() - start}


if __name__ == "__main__":
    for pair in sys.argv[1:]:
        entry_name, _, file_name = pair.partition(":")
        result = run_reader(entry_name, file_name)
        print(json.dumps({"entry": entry_name, "file": file_name, **result}), flush=True)

"""A background save that the end of the process leaves in flight.

Each case runs a script whose last act is ``CheckpointManager(d).save(..., blocking=False)``
for a 512x512 ``Linear`` (its 1 MiB weight is hashed on the digest thread), then ends: the
set must be committed and verify — whatever way the script ended — or, where the save
cannot finish, stderr must say so in one line naming the step, the folder and the error.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from hostile_support import run_python

from tlckpt.codec.sets.checkpoint_set import verify_checkpoint
from tlckpt.codec.sets.set_folders import committed_steps

PREPARE = """
import os, sys
import torch
import tlckpt
torch.manual_seed(0)
model = torch.nn.Linear(512, 512)
opt = torch.optim.AdamW(model.parameters())
model(torch.randn(2, 512)).sum().backward()
opt.step()
folder = sys.argv[1]
"""

SAVE = "tlckpt.CheckpointManager(folder).save(1, model=model, optimizer=opt, blocking=False)\n"

#: How each script ends, right after the save call, and the exit status that gives.
ENDINGS = {
    "normal end": ("", 0),
    "sys.exit": ("sys.exit(0)\n", 0),
    "uncaught exception": ("raise ValueError('the training loop failed')\n", 1),
    "uncaught KeyboardInterrupt": ("raise KeyboardInterrupt\n", -2),
    # A Ctrl-C while the interpreter joins the writer cuts that join short; the exit hook
    # then waits for the save itself.
    "Ctrl-C during the exit": (
        "import signal, threading, time\n"
        "threading.Thread(target=lambda: (time.sleep(0.05), os.kill(os.getpid(),"
        " signal.SIGINT)), daemon=True).start()\n",
        0,
    ),
}


def _run(script: str, folder: Path) -> tuple[subprocess.CompletedProcess, int]:
    proc = run_python(["-c", script, str(folder)], timeout=120)
    return proc, proc.returncode


@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_a_background_save_in_flight_at_exit_is_committed(tmp_path: Path, ending: str) -> None:
    tail, status = ENDINGS[ending]
    proc, code = _run(PREPARE + SAVE + tail, tmp_path)
    # Python ends an uncaught KeyboardInterrupt by SIGINT (-2), or exits 130 where it cannot.
    assert code == status or (status == -2 and code == 130), proc.stderr
    assert "tlckpt:" not in proc.stderr, proc.stderr
    assert committed_steps(tmp_path) == [1], (os.listdir(tmp_path), proc.stderr)
    assert verify_checkpoint(tmp_path / f"step-{1:020d}").step == 1


def test_a_background_save_that_fails_at_exit_says_so_on_stderr(tmp_path: Path) -> None:
    # A file size limit makes the member writes fail (EFBIG), as a full disk would.
    limit = (
        "import resource, signal\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, resource.RLIM_INFINITY))\n"
    )
    proc, code = _run(PREPARE + limit + SAVE, tmp_path)
    assert code == 0, proc.stderr  # the script itself succeeded; the line tells the rest
    lines = [line for line in proc.stderr.splitlines() if line.startswith("tlckpt:")]
    assert lines == [
        f"tlckpt: the background save of step 1 in {tmp_path} failed, nothing was committed:"
        " OSError: [Errno 27] File too large"
    ], proc.stderr
    assert committed_steps(tmp_path) == []


def test_a_failure_already_raised_is_not_said_again_at_exit(tmp_path: Path) -> None:
    script = (
        PREPARE
        + "import errno\n"
        + "import tlckpt.runtime.sets.checkpoint_manager as cm\n"
        + "def refuse(*args, **kwargs):\n"
        + "    raise OSError(errno.ENOSPC, 'No space left on device')\n"
        + "cm.write_any = refuse  # what the manager writes a set with\n"
        + "handle = "
        + SAVE
        + "try:\n    handle.wait()\nexcept OSError as exc:\n    print('raised', exc.errno)\n"
    )
    proc, code = _run(script, tmp_path)
    assert code == 0, proc.stderr
    assert proc.stdout.strip() == "raised 28"
    assert "tlckpt:" not in proc.stderr, proc.stderr


def test_os_exit_leaves_no_set_half_committed(tmp_path: Path) -> None:
    """``os._exit`` skips every exit hook: nothing can finish the save, and nothing must be
    committed half-way (a leftover temporary folder is the next manager's to remove)."""
    proc, code = _run(PREPARE + SAVE + "os._exit(3)\n", tmp_path)
    assert code == 3, proc.stderr
    for step in committed_steps(tmp_path):
        verify_checkpoint(tmp_path / f"step-{step:020d}")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_does_not_wait_for_its_parents_save(tmp_path: Path) -> None:
    """A child forked while the parent's save is in flight has no writer thread: its exit
    must not wait for that save (it would wait forever), nor report it."""
    script = (
        PREPARE
        + "handle = "
        + SAVE
        + "pid = os.fork()\n"
        + "if pid == 0:\n    sys.exit(0)\n"
        + "_, status = os.waitpid(pid, 0)\n"
        + "print('child', os.waitstatus_to_exitcode(status))\n"
    )
    proc, code = _run(script, tmp_path)
    assert code == 0, proc.stderr
    assert proc.stdout.strip() == "child 0", proc.stderr
    assert committed_steps(tmp_path) == [1]


def test_digests_are_right_where_no_digest_thread_can_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Python 3.12 and later refuse new threads once shutdown has begun: large writes are
    then hashed inline, to the same digest."""
    import io

    import xxhash

    from tlckpt.codec.sets import set_digests

    def refuse() -> None:
        raise RuntimeError("can't create new thread at interpreter shutdown")

    monkeypatch.setattr(set_digests, "_digest_worker", None)
    monkeypatch.setattr(set_digests, "_DigestThread", refuse)
    data = os.urandom(3 * set_digests.PARALLEL_DIGEST_BYTES)
    writer = set_digests.DigestingWriter(io.BytesIO())
    writer.write(data)
    writer.write(data[:100])
    assert writer.hexdigest() == xxhash.xxh3_128(data + data[:100]).hexdigest()
    assert writer.size == len(data) + 100


def test_a_background_save_runs_inline_where_no_writer_thread_can_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    import torch

    import tlckpt
    from tlckpt.runtime.sets import writer_threads

    class Refused(threading.Thread):
        def start(self) -> None:
            raise RuntimeError("can't create new thread at interpreter shutdown")

    # The module's own name for it: every other thread of the process starts as usual.
    monkeypatch.setattr(writer_threads, "_Thread", Refused)
    model = torch.nn.Linear(4, 4)
    handle = tlckpt.CheckpointManager(tmp_path).save(3, model=model, blocking=False)
    assert handle.done()
    assert handle.wait() == tmp_path / f"step-{3:020d}"
    assert verify_checkpoint(handle.wait()).step == 3


def test_the_background_save_path_takes_no_work_from_an_executor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``concurrent.futures`` shut down, as at interpreter exit (every ``submit``
    raises), a background save of a model past every parallel threshold (the digest
    thread's 1 MiB, ``codec.transfer``'s 32 MiB) still commits a set that verifies."""
    import concurrent.futures.thread

    import torch

    import tlckpt

    monkeypatch.setattr(concurrent.futures.thread, "_shutdown", True)
    model = torch.nn.Linear(4096, 2560)  # 40 MiB of weight
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 4096)).sum().backward()
    opt.step()
    manager = tlckpt.CheckpointManager(tmp_path)
    handle = manager.save(7, model=model, optimizer=opt, blocking=False)
    assert verify_checkpoint(handle.wait()).step == 7

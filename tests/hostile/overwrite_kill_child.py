"""Child of ``test_set_overwrite_kills``: overwrite a checkpoint set, SIGKILLed at a chosen
point of the commit.

    python overwrite_kill_child.py FOLDER STEP TAG KILL_AT MODE

Writes a small set (a one-tensor ``TLSF32B`` model and a training state whose ``extra`` is
``{"tag": TAG}``) as ``FOLDER/step-<STEP>`` with ``overwrite=True``. Once the commit begins,
every file-system call that changes names or makes them durable (``rename``, ``replace``,
``unlink``, ``rmdir``, ``fsync``, the exchange) counts; the ``KILL_AT``-th kills the process
with SIGKILL before it runs. ``MODE`` ``exchange`` uses the exchange where the platform has
it; ``no-exchange`` makes it report "unsupported", as on a file system without one. A child
that was not killed prints how many calls there were and exits 0.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from tlckpt.codec.model_state.float32_state_writer import write_float32_state
from tlckpt.codec.sets import set_commit
from tlckpt.codec.sets.set_document_writing import build_training_state
from tlckpt.formats.checkpoint_set import folder_name

_calls = 0
_counting = False


def write(folder: str, step: int, tag: int, *, overwrite: bool) -> None:
    """The small set of ``step`` tagged ``tag`` in ``folder``."""
    path = os.path.join(folder, folder_name(step))
    with set_commit.SetWriter(path, step, overwrite=overwrite) as writer:
        with writer.member("model", "model.tlsf32", 1) as f:
            write_float32_state(f, [np.full(3, tag, np.float32)])
        with writer.member("training_state", "training_state.json", 1, "training_state") as f:
            f.write(build_training_state(step, None, None, None, None, {"tag": tag}))
        writer.commit([("w", (3,))])


def _hooked(kill_at: int, function: Callable[..., Any]) -> Callable[..., Any]:
    def hooked(*args: Any, **kwargs: Any) -> Any:
        global _calls
        if _counting:
            _calls += 1
            if _calls == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
        return function(*args, **kwargs)

    return hooked


def main(folder: str, step: int, tag: int, kill_at: int, mode: str) -> None:
    global _counting
    for name in ("rename", "replace", "unlink", "rmdir", "fsync"):
        setattr(os, name, _hooked(kill_at, getattr(os, name)))
    if hasattr(set_commit, "exchange"):  # the library's exchange (older ones had none)
        if mode == "no-exchange":
            set_commit.exchange = _hooked(kill_at, lambda first, second: False)
        else:
            set_commit.exchange = _hooked(kill_at, set_commit.exchange)
    commit = set_commit.SetWriter.commit

    def counted_commit(self: Any, *args: Any, **kwargs: Any) -> Any:
        global _counting
        _counting = True
        return commit(self, *args, **kwargs)

    set_commit.SetWriter.commit = counted_commit  # type: ignore[method-assign]
    write(folder, step, tag, overwrite=True)
    _counting = False
    print(_calls)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])

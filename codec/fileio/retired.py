"""The file a save replaces, released off the caller's path.

``rename`` over an existing file drops its last link inside the call: the kernel then evicts
its cached pages and frees its blocks before the rename returns. Measured on ext4 here: 14-15
ms for a 64 MiB file, 127-145 ms for 512 MiB — a large share of a save that overwrites a
checkpoint of the same size. So before the rename of a large save, the old file is given a
second name, a temporary's of the same destination (:func:`retire`), locked like a live
save's temporary; after the commit, a thread of its own drops that name and the lock
(:meth:`Retired.release`), and the freeing happens there.

Nothing is lost if the process dies in between: the second name is a library temporary
whose lock dies with the process, so the next save of the destination (or
:func:`~.atomic.clean_temporaries`) removes it; the commit itself never depends on it (where
the old file cannot be linked — another file system type, a lock someone holds, no hard
links — it is replaced as before). The release thread is not a daemon: the interpreter
waits for it before exiting, so no second name outlives a process that ends normally.

May import: the standard library only.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import threading

__all__ = ["RETIRE_MIN_BYTES", "Retired", "retire", "wait_for_releases"]

#: Old files from this size on are released on a thread (below it, freeing takes less time
#: than the link, lock and thread cost: ~0.1-0.2 ms).
RETIRE_MIN_BYTES = 16 << 20
#: The release threads' name.
_RELEASE_THREAD = "tlckpt-release"


def wait_for_releases() -> None:
    """Block until every old file this process is freeing is freed (its second name gone):
    for a caller that lists the folder, or measures the disk, right after a save."""
    for thread in threading.enumerate():
        if thread.name == _RELEASE_THREAD and thread is not threading.current_thread():
            thread.join()


class Retired:
    """An old destination file held under a second, locked name until :meth:`release`.

    Attributes:
        path: the second name.
    """

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self._fd = fd

    def release(self, *, wait: bool = False) -> None:
        """Drop the second name and the lock; on a thread of its own unless ``wait`` (or no
        thread can be started: at interpreter shutdown)."""
        if not wait:
            thread = threading.Thread(target=self._drop, name=_RELEASE_THREAD, daemon=False)
            try:
                thread.start()
                return
            except RuntimeError:  # "can't create new thread at interpreter shutdown"
                pass
        self._drop()

    def _drop(self) -> None:
        try:
            with contextlib.suppress(OSError):  # gone already: nothing left to free
                os.unlink(self.path)
        finally:
            os.close(self._fd)  # the last reference: the kernel frees the file here


def retire(dest: str, second: str) -> Retired | None:
    """Give the regular file at ``dest``, if it has :data:`RETIRE_MIN_BYTES` or more, the
    second name ``second`` (a temporary name of the same destination), locked as a live
    save's temporary is; ``None`` where it is smaller, absent, not a plain file, locked by
    someone, or cannot be linked. Never raises ``OSError``: the save then replaces it as
    before.

    Should another save replace ``dest`` between the open and the link, ``second`` names a
    file whose name a save took (or is taking): freeing it later is right all the same. Only
    the lock is then on another file, so a cleaner may remove ``second`` first, which the
    release takes in its stride."""
    try:
        fd = os.open(dest, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:  # absent, a symbolic link, unreadable: replaced in the rename
        return None
    retired = None
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_size >= RETIRE_MIN_BYTES:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a cleaner must pass it over
            os.link(dest, second, follow_symlinks=False)
            retired = Retired(second, fd)
    except OSError:  # locked by someone, no hard links here, a name taken: as before
        pass
    finally:
        if retired is None:
            os.close(fd)
    return retired

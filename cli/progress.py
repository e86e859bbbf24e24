"""Progress bars for the command line: large files only, and only on a terminal.

The codec reads from any seekable binary file object, so a bar needs no hook in it: the
command hands the codec a thin wrapper around the open file that reports its position to
``tqdm``. Files up to :data:`THRESHOLD` bytes, output that is not a terminal, or a missing
``tqdm`` all mean: no bar, and the codec gets the plain path.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any, BinaryIO

from ..codec.fileio.source import open_regular

__all__ = ["THRESHOLD", "enabled", "reading", "counting"]

#: Files larger than this get a bar (64 MiB).
THRESHOLD = 64 << 20


def enabled(nbytes: int) -> bool:
    """Whether work on ``nbytes`` bytes shows a bar: large, stderr a terminal, tqdm present."""
    if nbytes <= THRESHOLD or not sys.stderr.isatty():
        return False
    try:
        import tqdm  # noqa: F401
    except ImportError:
        return False
    return True


def _bar(total: int, desc: str) -> Any:
    from tqdm import tqdm

    return tqdm(
        total=total,
        desc=desc,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        file=sys.stderr,
        leave=False,
    )


class _ReportingFile:
    """A read-only file object that moves a bar to its position after every operation."""

    def __init__(self, file: BinaryIO, bar: Any):
        self._file = file
        self._bar = bar
        self.name = file.name

    def _report(self) -> None:
        pos = self._file.tell()
        if pos > self._bar.n:
            self._bar.update(pos - self._bar.n)

    def read(self, size: int = -1) -> bytes:
        data = self._file.read(size)
        self._report()
        return data

    def readinto(self, buffer: Any) -> int:
        n = self._file.readinto(buffer)
        self._report()
        return n

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        pos = self._file.seek(offset, whence)
        self._report()
        return pos

    def tell(self) -> int:
        return self._file.tell()

    def fileno(self) -> int:
        return self._file.fileno()


@contextlib.contextmanager
def reading(path: str | os.PathLike, desc: str) -> Iterator[str | os.PathLike | Any]:
    """What to hand a reader for ``path``: the path itself, or a file that drives a bar.

    Args:
        path: the file to read.
        desc: the bar's label.
    """
    if not enabled(os.path.getsize(path)):
        yield path
        return
    with open_regular(path) as f, _bar(os.fstat(f.fileno()).st_size, desc) as bar:
        yield _ReportingFile(f, bar)


class _Counting:
    """``items`` as they are iterated, advancing a bar by each one's ``nbytes``; sized."""

    def __init__(self, items: Sequence[Any], total_bytes: int, desc: str):
        self.items = items
        self.total_bytes = total_bytes
        self.desc = desc

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[Any]:
        with _bar(self.total_bytes, self.desc) as bar:
            for item in self.items:
                yield item
                bar.update(item.nbytes)


def counting(items: Sequence[Any], total_bytes: int, desc: str) -> Sequence[Any] | _Counting:
    """``items`` (arrays being written) as a writer takes them: when the work shows a bar,
    a sized iterable that advances it by each one's ``nbytes``; else ``items`` themselves."""
    if not enabled(total_bytes):
        return items
    return _Counting(items, total_bytes, desc)

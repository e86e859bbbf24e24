"""Memory probes for one benchmark process: resident set now, and its peak since a reset.

The peak comes from ``VmHWM`` in ``/proc/self/status``, reset before each operation by
writing ``5`` to ``/proc/self/clear_refs`` (Linux ≥ 4.0). Where that is refused, the fallback
is ``resource.getrusage``'s ``ru_maxrss``, which cannot be reset: the peak is then the
process's lifetime peak and a growth computed from it is flagged as not reliable.
"""

from __future__ import annotations

import resource

__all__ = ["PeakProbe", "current_rss"]

_STATUS = "/proc/self/status"
_CLEAR_REFS = "/proc/self/clear_refs"


def _status_bytes(field: str) -> int | None:
    try:
        with open(_STATUS, encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024  # the kernel reports kB
    except OSError:
        return None
    return None


def current_rss() -> int:
    """The process's resident set size now, in bytes (0 where it cannot be read)."""
    return _status_bytes("VmRSS") or 0


class PeakProbe:
    """Peak resident set size since the last :meth:`reset`.

    ``resettable`` says whether resets work; without them :meth:`peak` is the process's
    lifetime peak (``getrusage``), an upper bound on the peak of the operation.
    """

    def __init__(self) -> None:
        self.resettable = self.reset()

    def reset(self) -> bool:
        """Start a new measurement window; return whether the kernel accepted the reset."""
        try:
            with open(_CLEAR_REFS, "w", encoding="ascii") as f:
                f.write("5")
        except OSError:
            return False
        return _status_bytes("VmHWM") is not None

    def peak(self) -> int:
        """Peak resident set size in bytes since the last reset (or since start)."""
        if self.resettable:
            hwm = _status_bytes("VmHWM")
            if hwm is not None:
                return hwm
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux

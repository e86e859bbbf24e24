"""One operation, once, in a fresh process: ``python -m bench.probe '<spec>'``.

What a user who starts a process to load a checkpoint meets: nothing warmed up (first
calls, allocator pools), and — for ``"cache": "cold"`` — the file not in the page cache
(:func:`~bench.measure.drop_cache`: the whole cache where permitted, else the file's pages).
The process builds the group's live state (untimed, the same values as :mod:`bench.group`),
reads the files :mod:`bench.group` left in the scratch folder, and prints one line
``BENCH-RESULT <json>``: the seconds of the call and its peak resident-set growth (VmHWM
after, reset through ``/proc/self/clear_refs`` before, minus VmRSS before; the allocator as
users have it).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time

from bench.group import MARKER, build
from bench.measure import PeakProbe, current_rss, drop_cache
from bench.models import SIZES
from bench.ways import optimizer_ways, state_ways

__all__ = ["main"]


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    # The library's import is not the call's: tlckpt's runtime is imported lazily, at the
    # first call, and after the cache is dropped that read ~570 modules from disk (2-3 s in
    # the cold figures); safetensors.torch and torch are imported before too.
    import tlckpt.runtime  # noqa: F401

    live = build(spec["group"], SIZES[spec["mode"]])
    folder = spec["folder"]
    if spec["group"] == "bf16":
        from bench.bf16 import bf16_ways

        saves, loads = bf16_ways(live["module"], folder)
    elif spec["kind"] == "optimizer":
        saves, loads = optimizer_ways(live["module"], live["optimizer"], folder)
    else:
        saves, loads = state_ways(live["module"], folder)
    way = (saves if spec["op"] == "save" else loads)[spec["way"]]
    if way.prepare is not None:
        way.prepare()
    files = [os.path.join(d, f) for d, _, names in os.walk(folder) for f in names]
    cache = drop_cache(files) if spec["cache"] == "cold" else "warm"
    gc.collect()
    probe = PeakProbe()
    before = current_rss()
    probe.reset()
    t0 = time.perf_counter()
    way.run()
    seconds = time.perf_counter() - t0
    result = {
        **spec,
        "seconds": seconds,
        "peak_growth": probe.peak() - before,
        "peak_resettable": probe.resettable,
        "cache_method": cache,
    }
    print(MARKER + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

"""atheris targets: one per family's reader (Adam, TLSF32B, exact-bits JSON, tlckpt's own
optimizer family ``TLCKOPT``, safetensors, optimizer trees), and ``inspect``.

Each target is a function of the fuzzer's bytes that may return or raise
:class:`~tlckpt.codec.CheckpointError`; anything else is a crash. A ``CheckpointError`` that
says "internal error" (the fast and interpreted parsers disagreeing) is a crash too.

The destination-reading targets take their first byte as a selector: bit 7 runs the reader
under :func:`tlckpt.codec.spec.walker.interpreted` (construct's field-by-field parser instead of
the precompiled fast path); the low 7 bits pick a destination from the seed files'
destinations, 0 meaning "no destination" (the family's own description of the file, as
``inspect`` makes it). Readers and descriptions are the family handlers' of the codec's
family registry. The seed corpus prefixes every file with its own destination, with 0, and
with its own destination in interpreted mode.

Nothing here may be imported before the runner has set up instrumentation; the runner
imports this module inside ``atheris.instrument_imports``.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable
from typing import Any

from .seeds import Seed, generated_seeds, vector_seeds

TARGETS = ("adam", "tlsf32", "json", "tlckopt", "safetensors", "optimizer_tree", "inspect")
#: Largest seed put in a corpus (libFuzzer's -max_len is set to this too).
MAX_LEN = 16384

#: Target → the registered family it reads (a test checks every family has a target; the
#: names are fixed here because this module may not import the library before instrumenting).
KIND = {
    "adam": "adam",
    "tlsf32": "float32_state",
    "json": "state_bits",
    "tlckopt": "tlckpt_optimizer",
    "safetensors": "safetensors",
    "optimizer_tree": "optimizer_tree",
    "inspect": None,
}


def target_seeds(target: str) -> list[Seed]:
    """The seeds whose destinations a target selects from (deterministic order)."""
    kind = KIND[target]
    seeds = [s for s in vector_seeds() + generated_seeds() if len(s.data) <= MAX_LEN]
    return [s for s in seeds if kind is None or s.kind == kind]


def corpus(target: str) -> list[bytes]:
    """Seed corpus entries for ``target`` (selector byte included where it takes one)."""
    seeds = target_seeds(target)
    if target == "inspect":
        return [s.data for s in seeds]
    out = []
    for k, s in enumerate(seeds):
        own = (k % 127) + 1
        out += [bytes([own]) + s.data, bytes([0]) + s.data, bytes([0x80 | own]) + s.data]
    return out


class InternalError(AssertionError):
    """The library reported an internal inconsistency: a bug, not a rejection."""


def make_target(target: str) -> Callable[[bytes], None]:
    """The function atheris calls for ``target``."""
    from tlckpt.codec import DEFAULT_MAX_JSON_BYTES, CheckpointError, inspect
    from tlckpt.codec.families import family_named
    from tlckpt.codec.spec.plan import interpreted

    dests = [s.dest for s in target_seeds(target)]

    def checked(call: Callable[[], Any]) -> None:
        try:
            call()
        except CheckpointError as exc:
            if "internal error" in str(exc):
                raise InternalError(str(exc)) from exc

    if target == "inspect":
        return lambda data: checked(lambda: inspect(io.BytesIO(data)))
    family = family_named(KIND[target])

    def one(data: bytes) -> None:
        if not data:
            return
        sel, body = data[0], io.BytesIO(data[1:])
        k = (sel & 0x7F) % (len(dests) + 1)
        mode = interpreted() if sel & 0x80 else contextlib.nullcontext()
        d = dests[k - 1] if k else None
        with mode:
            if d is None:  # no destination: the file against its own layout
                checked(lambda: family.describe(body, DEFAULT_MAX_JSON_BYTES))
            else:
                checked(lambda: family.read(body, d, True, DEFAULT_MAX_JSON_BYTES))

    return one

"""A mutation spec, and how it is applied (see :mod:`fuzz.mutators`).

A *spec* is a small picklable tuple ``(op, *args)``; :func:`apply` turns a seed's bytes and a
spec into the mutated bytes where the case runs; :func:`describe` names it in reports.
"""

from __future__ import annotations

import json
import struct

#: A file this size or smaller is mutated exhaustively, a larger one by sample.
SMALL = 4096

Spec = tuple


_SENTINEL = "\u0000tlckpt-fuzz-sentinel\u0000"
_MARKER = json.dumps(_SENTINEL).encode()


def _json_template(data: bytes, path: tuple, cache: dict) -> bytes:
    """The document ``data`` (compact) with the node at ``path`` replaced by a marker.

    ``path == ()`` is the whole document; a missing key of an object is added. The parsed
    document and the latest template are cached per seed: the systematic set replaces each
    node by every hostile value in turn, and serialising a 700 KB document once per value
    (under the worker's tracemalloc) was most of the time those inputs took.
    """
    key = id(data)
    hit = cache.get(key)
    if hit is None or hit[0] is not data:
        hit = [data, json.loads(data), None, b""]
        cache[key] = hit
    if hit[2] == path:
        return hit[3]
    if not path:
        template = _MARKER
    else:
        *parents, last = path
        node = hit[1]
        for p in parents:
            node = node[p]
        missing = isinstance(node, dict) and last not in node
        old = None if missing else node[last]
        node[last] = _SENTINEL
        try:
            template = json.dumps(hit[1], separators=(",", ":")).encode()
        finally:
            if missing:
                del node[last]
            else:
                node[last] = old
    hit[2], hit[3] = path, template
    return template


def apply(data: bytes, spec: Spec, cache: dict | None = None) -> bytes:
    """The mutated bytes for ``spec`` (see the module docstring for the ops)."""
    op = spec[0]
    if op == "none":
        return data
    if op == "trunc":
        return data[: spec[1]]
    if op == "xor":
        pos, mask = spec[1], spec[2]
        return data[:pos] + bytes([data[pos] ^ mask]) + data[pos + 1 :]
    if op == "u64":
        pos, value = spec[1], spec[2]
        return data[:pos] + struct.pack("<Q", value) + data[pos + 8 :]
    if op == "replace":  # data[start:end] = payload
        start, end, payload = spec[1], spec[2], spec[3]
        return data[:start] + payload + data[end:]
    if op == "move":  # data[dst0:dst1] = data[src0:src1] (copied from the original)
        src0, src1, dst0, dst1 = spec[1:5]
        return data[:dst0] + data[src0:src1] + data[dst1:]
    if op == "swap":  # records [a0, a1) and [b0, b1), a before b
        a0, a1, b0, b1 = spec[1:5]
        return data[:a0] + data[b0:b1] + data[a1:b0] + data[a0:a1] + data[b1:]
    if op == "rec":  # a record-level mutation, labelled: ("rec", kind, group, index, inner)
        return apply(data, spec[4], cache)
    if op == "seq":  # several specs, applied in order to the running result
        out = data
        for sub in spec[1]:
            out = apply(out, sub, cache)
        return out
    if op == "json_set":  # the node at path spec[1] replaced by the raw JSON text spec[2]
        template = _json_template(data, spec[1], cache if cache is not None else {})
        return template.replace(_MARKER, spec[2], 1)
    if op == "bytes":
        return spec[1]
    raise ValueError(f"unknown mutation {op!r}")


def describe(spec: Spec) -> str:
    """A short, bounded description of a spec for reports."""
    text = repr(spec)
    return text if len(text) <= 160 else text[:150] + f"...({len(text)} chars)"

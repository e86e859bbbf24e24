"""Mutations of JSON seeds (see :mod:`fuzz.mutators`): character edits everywhere or
sampled, and structural edits (hostile values in every node, deep nesting, documents that
break the schema).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

from .mutation_spec import SMALL, Spec

# ------------------------------------------------------------------------------ JSON

JSON_INSERTS = (
    b"[",
    b"]",
    b"{",
    b"}",
    b'"',
    b",",
    b":",
    b"-",
    b"0",
    b"9",
    b"e",
    b".",
    b" ",
    b"\\",
    b"\x00",
    b"\xff",
    b"n",
    b"1" * 30,
)

#: Replacement texts for a value: huge/odd integers, floats, other types, odd literals.
HOSTILE_VALUES = (
    b"18446744073709551616",
    b"18446744073709551615",
    b"4294967296",
    b"65536",
    b"256",
    b"-1",
    b"-0",
    b"-9223372036854775809",
    b"1" + b"0" * 400,
    b"9" * 5000,
    b"1e400",
    b"1E2",
    b"0.0",
    b"1.5",
    b"NaN",
    b"Infinity",
    b"-Infinity",
    b"true",
    b"false",
    b"null",
    b'"1"',
    b"[]",
    b"{}",
    b"[1,2]",
    b"[[1,2]]",
    b"0x10",
    b"00",
    b"01",
    b"+1",
    b"1.",
    b".5",
    b"9" * 30,
    b"1e-400",
    b'"\\ud800"',
    b"[" * 10000,
    b"[" * 10000 + b"]" * 10000,
)


def deep(n: int, open_: bytes = b"[", close: bytes = b"]") -> bytes:
    return open_ * n + close * n


def _json_documents(doc: Any, tag: str) -> Iterator[bytes]:
    """Whole documents: nesting bombs, duplicated keys, other top-level types, encodings."""
    state = json.dumps(doc.get("state", []) if isinstance(doc, dict) else []).encode()
    t = json.dumps(tag).encode()
    yield b"[" * 10000
    yield deep(10000)
    yield b'{"a":' * 10000 + b"1" + b"}" * 10000
    for depth in (1023, 1024, 1025, 100_000):
        yield b'{"format":' + t + b',"state":[' + deep(depth) + b"]}"
        yield b'{"format":' + t + b',"state":[{"shape":[1],"values":' + deep(depth) + b"}]}"
    yield b'{"format":' + t + b',"format":"other","state":' + state + b"}"
    yield b'{"format":"other","format":' + t + b',"state":' + state + b"}"
    yield b'{"format":' + t + b',"state":[],"state":' + state + b"}"
    yield b'{"format":' + t + b',"state":' + state + b',"state":[]}'
    yield b'{"format":' + t + b',"state":' + state + b',"extra":' + deep(500) + b"}"
    yield from (b"[]", b"1", b"null", b'"x"', b"true", b"", b" ", b"{", b"}", b"\xef\xbb\xbf{}")
    utf8 = json.dumps(doc).encode()
    yield b"\xef\xbb\xbf" + utf8
    yield json.dumps(doc).encode("utf-16")
    yield utf8.replace(b"torchlean", b"torchlean\xff", 1)
    yield utf8.replace(b'"format"', b'"form\\u0061t"', 1)
    yield utf8 + b"\x00"
    yield utf8 + b" garbage"
    yield utf8.replace(b"{", b"{\n" + b" " * 100_000, 1)
    for bad_tag in (
        "torchlean_state_binary_99999999999999999999_1_1_ieee_v1",
        "torchlean_state_binary_0_1_1_ieee_v1",
        "torchlean_state_binary_11_52_1023_ieee_v1",
        "torchlean_state_binary_5_10_15_ieee_v1",
        "torchlean_state_binary_63_0_1_finite_v1",
        "torchlean_state_binary_64_0_1_finite_v1",
        "torchlean_state_binary_" + "1" * 5000 + "_1_1_ieee_v1",
        "torchlean_state_complex_v1(" * 50 + "torchlean_state_bits_v1" + ")" * 50,
        "torchlean_state_complex_v1(torchlean_state_complex_v1(torchlean_state_bits_v1))",
        "x" * 1_000_000,
        "",
    ):
        yield b'{"format":' + json.dumps(bad_tag).encode() + b',"state":' + state + b"}"


def _json_nodes(doc: Any, entries: int = 8) -> Iterator[tuple]:
    """Paths worth replacing: the top-level keys, each entry, its shape/values, some values."""
    if not isinstance(doc, dict):
        return
    yield ("format",)
    yield ("state",)
    state = doc.get("state")
    if not isinstance(state, list):
        return
    for i, entry in enumerate(state[:entries]):
        yield ("state", i)
        if not isinstance(entry, dict):
            continue
        for key in ("shape", "values"):
            if key in entry:
                yield ("state", i, key)
        shape = entry.get("shape")
        if isinstance(shape, list) and shape:
            yield ("state", i, "shape", 0)
            yield ("state", i, "shape", len(shape) - 1)
        values = entry.get("values")
        if isinstance(values, list) and values:
            for k in sorted({0, len(values) // 2, len(values) - 1}):
                yield ("state", i, "values", k)
                if isinstance(values[k], list) and values[k]:
                    yield ("state", i, "values", k, 0)
                    yield ("state", i, "values", k, len(values[k]) - 1)


def json_systematic(data: bytes, rng: random.Random) -> Iterator[Spec]:
    """Character edits everywhere (small) or sampled (large); structural edits in full on
    small documents, on the first entry of large ones (the same code paths, at a fraction of
    the cost of re-serialising a 700 KB document per case)."""
    n = len(data)
    small = n <= SMALL
    yield ("none",)
    positions = list(range(n)) if small else sorted(rng.sample(range(n), 250))
    for k in positions:
        yield ("trunc", k)
    for k in positions:
        yield ("replace", k, k + 1, b"")  # delete one character
    for i, k in enumerate(positions):
        yield ("replace", k, k, JSON_INSERTS[i % len(JSON_INSERTS)])
    if not small:
        for _ in range(250):
            k = rng.randrange(n)
            yield ("replace", k, k, rng.choice(JSON_INSERTS))
    try:
        doc = json.loads(data)
    except ValueError:
        return
    tag = doc.get("format", "") if isinstance(doc, dict) else ""
    for path in _json_nodes(doc, entries=8 if small else 1):
        for raw in HOSTILE_VALUES:
            yield ("json_set", path, raw)
    if isinstance(doc, dict) and isinstance(doc.get("state"), list):
        for i, entry in enumerate(doc["state"][: 4 if small else 1]):
            if not isinstance(entry, dict):
                continue
            for shape in (
                b"[18446744073709551616,18446744073709551616]",
                b"[0,1e400]",
                b"[" + b",".join([b"9223372036854775807"] * 45_000) + b"]",
                b"[" + b",".join([b"0"] * 100_000) + b"]",
                b"[-1]",
                b"[1.0]",
                b"[true]",
                b"[[2]]",
            ):
                yield ("json_set", ("state", i, "shape"), shape)
            yield ("json_set", ("state", i), b'{"shape":[1],"shape":[2],"values":[0]}')
            yield ("json_set", ("state", i), b'{"values":[0],"shape":[1],"values":[1,2]}')
            yield ("json_set", ("state", i), b'{"shape":[],"values":[0],"extra":{"x":[]}}')
        yield ("json_set", ("state",), b"[" + b",".join([b"{}"] * 50_000) + b"]")
        yield ("json_set", ("state",), b"[" + b",".join([b"[]"] * 50_000) + b"]")
        yield (
            "json_set",
            ("state",),
            b"[" + b",".join([b'{"shape":[],"values":[0]}'] * 20_000) + b"]",
        )
    for document in _json_documents(doc, tag if isinstance(tag, str) else ""):
        yield ("bytes", document)

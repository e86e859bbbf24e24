"""The safetensors family in the family registry: recognised from its first bytes, described
by ``inspect``, checked against a destination (names, dtypes, shapes), fuzzed from its
examples.

A safetensors file has no magic. Its first 8 bytes are the header length, at most 100 MB, so
bytes 4 to 7 are zero — which no JSON text has (JSON holds no NUL byte) — and byte 8 is
``{``: the sniff asks for both (the reader then refuses a length beyond the limit or the
file, precisely).
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...formats.primitives import unpack_u64
from ...formats.safetensors import HEADER_LENGTH_SIZE, HEADER_START
from ..errors import SchemaMismatchError
from ..families import FamilyExample, FamilyHandler
from ..fileio.source import PathOrFile, open_source
from ..inspection import file_size
from ..values.destinations import description_error
from .header import Header
from .reader import read_array, read_header
from .writer import TensorData, write_safetensors

__all__ = [
    "SAFETENSORS_FAMILY",
    "NamedTensorsTarget",
    "describe_header",
    "looks_like_safetensors",
]

#: Lengths the sniff takes: any with the upper four bytes zero, past the 100 MB limit too, so
#: that a damaged length is refused by the reader, precisely, not called "no checkpoint".
_SNIFF_BOUND = 1 << 32


def looks_like_safetensors(head: bytes, remaining: int) -> bool:
    """Whether a file starting with ``head`` is a safetensors file as far as its first bytes
    tell: a header length whose upper four bytes are zero, then ``{``."""
    if len(head) <= HEADER_LENGTH_SIZE:
        return False
    length = unpack_u64(head)
    start = head[HEADER_LENGTH_SIZE : HEADER_LENGTH_SIZE + 1]
    return 0 < length < _SNIFF_BOUND and start == HEADER_START


@dataclass(frozen=True)
class NamedTensorsTarget:
    """What a safetensors file must hold: exactly these tensors.

    Attributes:
        tensors: ``(name, dtype name, shape)`` for each, in any order.
        source: where the destination came from, for messages.
    """

    tensors: tuple[tuple[str, str, tuple[int, ...]], ...]
    source: str | None = None


def describe_header(header: Header) -> list[dict[str, Any]]:
    """Each tensor of a safetensors header as ``inspect`` describes it: name, dtype, shape,
    elements and bytes, in the header's order."""
    return [
        {
            "name": e.name,
            "dtype": e.dtype.name,
            "shape": list(e.shape),
            "elements": e.elements,
            "bytes": e.nbytes,
        }
        for e in header.entries.values()
    ]


def _check_against(header: Header, target: NamedTensorsTarget) -> None:
    where = "" if target.source is None else f" ({target.source})"
    wanted = {name: (dtype, tuple(shape)) for name, dtype, shape in target.tensors}
    missing = sorted(set(wanted) - set(header.entries))
    extra = sorted(set(header.entries) - set(wanted))
    if missing or extra:
        differ = f"the tensors differ from the destination's{where}"
        raise SchemaMismatchError(
            f"{differ}: missing {missing[:5]}, unexpected {extra[:5]}",
            field="header",
            actual=extra[:5],
            expected=missing[:5],
        )
    for name, (dtype, shape) in wanted.items():
        entry = header.entries[name]
        if (entry.dtype.name, entry.shape) != (dtype, shape):
            raise SchemaMismatchError(
                f"tensor {name!r} is {entry.dtype.name} {list(entry.shape)}; the"
                f" destination{where} has {dtype} {list(shape)}",
                field=f"header[{name!r}]",
                actual=(entry.dtype.name, list(entry.shape)),
                expected=(dtype, list(shape)),
            )


@dataclass(frozen=True)
class _SafetensorsFamily(FamilyHandler):
    def sniff(self, head: bytes, remaining: int) -> bool:
        return looks_like_safetensors(head, remaining)

    def describe(self, file: PathOrFile, max_json_bytes: int = 0) -> dict[str, Any]:
        with open_source(file) as src:
            header = read_header(src)
        return {
            "family": self.name,
            "header_bytes": header.header_length,
            "metadata": dict(header.metadata or {}),
            "tensors": describe_header(header),
            "bytes": file_size(file),
        }

    def destination(self, file: PathOrFile, max_json_bytes: int) -> NamedTensorsTarget:
        with open_source(file) as src:
            header = read_header(src)
        source = os.fspath(file) if isinstance(file, (str, os.PathLike)) else None
        tensors = tuple((e.name, e.dtype.name, e.shape) for e in header.entries.values())
        return NamedTensorsTarget(tensors, source)

    def parse_destination(self, description: Mapping[str, Any], source: str) -> Any:
        tensors = description.get("tensors")
        if not isinstance(tensors, list):
            raise description_error(f"{source}: 'tensors' must be a list")
        out = []
        for i, t in enumerate(tensors):
            ok = isinstance(t, Mapping) and isinstance(t.get("name"), str)
            ok = ok and isinstance(t.get("dtype"), str) and isinstance(t.get("shape"), list)
            if not ok or not all(type(d) is int and d >= 0 for d in t["shape"]):
                raise description_error(f"{source}: tensors[{i}] needs name, dtype and shape")
            out.append((t["name"], t["dtype"], tuple(t["shape"])))
        return NamedTensorsTarget(tuple(out), source)

    def examples(self) -> tuple[FamilyExample, ...]:
        rng = np.random.default_rng(21)
        small = {
            "weight": rng.standard_normal((3, 4)).astype("<f4"),
            "bias": rng.integers(0, 2**16, 4, dtype="<u2").view("<f2"),
            "steps": np.asarray(7, dtype="<i8"),
            "empty": np.zeros((0, 2), dtype="<f8"),
            'odd "name"\\é': np.asarray([True, False]),
        }
        bf16 = {
            "embed": TensorData("BF16", (4, 2), rng.integers(0, 2**16, 8, dtype="<u2")),
            "scale": TensorData("F8_E4M3", (5,), rng.integers(0, 256, 5, dtype="u1")),
        }
        out = []
        for name, tensors, metadata in (
            ("safetensors_small", small, {"format": "pt"}),
            ("safetensors_bf16", bf16, None),
        ):
            buffer = io.BytesIO()
            write_safetensors(buffer, tensors, metadata=metadata)
            data = buffer.getvalue()
            out.append(FamilyExample(name, data, self.destination(io.BytesIO(data), 0)))
        return tuple(out)

    def takes(self, target: Any) -> bool:
        return isinstance(target, NamedTensorsTarget)

    def read(self, file: PathOrFile, target: Any, payloads: bool, max_json_bytes: int) -> Any:
        with open_source(file) as src:
            header = read_header(src)
            if isinstance(target, NamedTensorsTarget):
                _check_against(header, target)
            if not payloads:
                return header
            return {name: read_array(src, header, e) for name, e in header.entries.items()}


SAFETENSORS_FAMILY = _SafetensorsFamily(
    name="safetensors",
    label="safetensors",
    contents="named tensors of any dtype",
    title="the safetensors layout",
)

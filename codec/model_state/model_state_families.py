"""The two model-state families in the registry: ``TLSF32B`` and exact-bits JSON.

Both hold a model's tensors by position and take the same destinations, so a ``.pt`` or
``.safetensors`` model fits either, and both convert: what they share is
:class:`~tlckpt.codec.families.ModelStateFamily`. The readers and writers are
:mod:`.float32_state`, :mod:`.state_bits` and :mod:`.state_bits_writer`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ...formats.framing import FLOAT32_STATE_MAGIC
from ..errors import ConfigError
from ..families import Arrays, ModelStateFamily
from ..fileio.source import PathOrFile
from ..inspection import ElementCounts, file_size
from ..sniffing import JSON_FAMILY, JSON_WHITESPACE, UTF8_BOM
from ..values.destinations import ModelStateTarget
from .float32_state import read_float32_state, scan_float32_sizes, validate_float32_state
from .float32_state_writer import write_float32_state
from .state_bits import inspect_state_bits, read_state_bits
from .state_bits_writer import write_state_bits

__all__ = ["FLOAT32_STATE_FAMILY", "STATE_BITS_FAMILY"]


# --------------------------------------------------------------------------- TLSF32B


@dataclass(frozen=True)
class _Float32StateFamily(ModelStateFamily):
    def describe(self, file: PathOrFile, max_json_bytes: int = 0) -> dict[str, Any]:
        version, shapes, sizes = scan_float32_sizes(file)
        elements = ElementCounts()
        tensors = [
            {"shape": list(s), "elements": elements[s], "bytes": n} for s, n in zip(shapes, sizes)
        ]
        return {**self.header(version), "tensors": tensors, "bytes": file_size(file)}

    def read(self, file: PathOrFile, target: ModelStateTarget, payloads: bool, _: int) -> Any:
        if payloads:
            return read_float32_state(file, target.shapes)
        layout = validate_float32_state(file, target.shapes)
        if target.encoding not in (None, self.holds):
            where = "" if target.source is None else f" ({target.source})"
            raise ConfigError(
                f"{self.label} holds {self.holds}; the destination{where} is {target.encoding}",
                path=file if isinstance(file, (str, os.PathLike)) else None,
                actual=self.holds,
                expected=target.encoding,
            )
        return layout

    def write_arrays(self, path: PathOrFile, arrays: Arrays, encoding: str, pretty: bool) -> None:
        write_float32_state(path, arrays, count=len(arrays))


FLOAT32_STATE_FAMILY = _Float32StateFamily(
    contents="float32 model state",
    title="streamed float32 model state",
    magic=FLOAT32_STATE_MAGIC,
    format="tlsf32",
    extensions=(".tlsf32",),
    holds="float32",
)

# --------------------------------------------------------------------------- exact-bits JSON


@dataclass(frozen=True)
class _StateBitsFamily(ModelStateFamily):
    def sniff(self, head: bytes, remaining: int) -> bool:
        """A JSON document as far as its first bytes tell: its first significant byte ``{``
        or ``[``, a byte order mark, or only whitespace as far as the head goes."""
        first = head.lstrip(JSON_WHITESPACE)[:1]
        more_whitespace = not first and len(head) < remaining
        return head.startswith(UTF8_BOM) or first in (b"{", b"[") or more_whitespace

    def describe(self, file: PathOrFile, max_json_bytes: int) -> dict[str, Any]:
        return inspect_state_bits(file, max_json_bytes=max_json_bytes)

    def read(
        self, file: PathOrFile, target: ModelStateTarget, payloads: bool, max_json_bytes: int
    ) -> Any:
        encoding = target.encoding
        if encoding is None:  # the destination takes the file's own scalar type
            encoding = self._own_tag(file, max_json_bytes)
        return read_state_bits(file, target.shapes, encoding)

    def _own_tag(self, file: PathOrFile, max_json_bytes: int) -> str:
        if isinstance(file, (str, os.PathLike)):
            return self.describe(file, max_json_bytes)["format"]
        start = file.tell()
        try:
            return self.describe(file, max_json_bytes)["format"]
        finally:
            file.seek(start)

    def write_arrays(self, path: PathOrFile, arrays: Arrays, encoding: str, pretty: bool) -> None:
        write_state_bits(path, list(arrays), encoding, pretty=pretty)


STATE_BITS_FAMILY = _StateBitsFamily(
    name=JSON_FAMILY,
    label="exact-bits JSON",
    contents="model state",
    title="exact-bits JSON model state",
    format="json",
    extensions=(".json",),
)

"""Model state in memory, between file formats: named tensors and exact conversions.

A :class:`StateTensor` holds one tensor in the codec's array form (native numpy dtype where
numpy has one, storage words otherwise) with its exact-bits encoding name, so TLSF32B and
JSON state need nothing but numpy. :func:`exact_cast` converts a tensor to another scalar
type only when every value survives the trip both ways; torch is imported for the types
numpy lacks (bfloat16, float8, complex32) and for integer tensors.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..codec import ConfigError
from ..formats.state_bits import ENCODINGS, encoding_by_name
from ..optional import require

__all__ = [
    "INTEGER_DTYPES",
    "State",
    "StateTensor",
    "exact_cast",
    "from_torch",
    "label",
    "to_torch",
    "torch_module",
]

#: Encodings of integer and bool tensors (numpy dtype names): not a TorchLean scalar type,
#: they travel in a floating file type only when every value converts exactly.
INTEGER_DTYPES = frozenset(
    {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"}
)


@dataclass
class StateTensor:
    """One tensor of model state, in the codec's array form.

    Attributes:
        name: its name in a named file, ``None`` in a positional one.
        encoding: the exact-bits encoding (``"float32"``, ``"bfloat16"``, a full tag...) or,
            for integer and bool tensors, the numpy dtype name (``"int64"``).
        array: native numpy dtype where numpy has one, else storage words (see
            :func:`tlckpt.write_state_bits`).
    """

    name: str | None
    encoding: str
    array: np.ndarray

    @property
    def shape(self) -> tuple[int, ...]:
        fmt = encoding_by_name(self.encoding)
        if fmt is not None and fmt.pair and fmt.native_dtype is None:
            return tuple(self.array.shape[:-1])  # word pairs: drop the (re, im) axis
        return tuple(self.array.shape)


@dataclass
class State:
    """The tensors of one file, in order; ``encoding`` is the file's one scalar type, if any.

    ``ordered`` is false when the file does not say in which order its tensors go (a
    safetensors file without tlckpt's order metadata): they are then in name order, which a
    positional file must not take for the model's order.
    """

    tensors: list[StateTensor]
    encoding: str | None
    named: bool
    ordered: bool = True


def label(t: StateTensor, index: int) -> str:
    return f"tensor {index}" + (f" {t.name!r}" if t.name is not None else "")


# --------------------------------------------------------------------------- torch edges


def torch_module() -> Any:
    """``torch``, or :class:`~tlckpt.optional.MissingDependencyError` saying how to get it."""
    return require("torch", "converting safetensors and .pt files")


def _torch_dtype(encoding: str) -> Any:
    torch = torch_module()
    from ..runtime.binding.tensors import ENCODING_OF_DTYPE

    for dtype, name in ENCODING_OF_DTYPE.items():
        if name == encoding:
            return dtype
    if encoding in INTEGER_DTYPES:
        return getattr(torch, encoding)
    raise ConfigError(
        f"no torch dtype holds the {encoding!r} encoding", field="encoding", actual=encoding
    )


def from_torch(name: str | None, t: Any) -> StateTensor:
    from ..runtime.binding.tensors import ENCODING_OF_DTYPE, to_host

    torch = torch_module()
    if t.layout != torch.strided or t.is_quantized:
        kind = "quantized" if t.is_quantized else str(t.layout).removeprefix("torch.")
        raise ConfigError(
            f"tensor {name!r} is a {kind} tensor; only dense tensors convert",
            field=str(name),
            actual=kind,
        )
    t = t.detach().cpu().contiguous()
    if t.dtype in ENCODING_OF_DTYPE:
        return StateTensor(name, ENCODING_OF_DTYPE[t.dtype], to_host(t))
    dtype = str(t.dtype).removeprefix("torch.")
    if dtype in INTEGER_DTYPES:
        return StateTensor(name, dtype, t.numpy())
    raise ConfigError(
        f"tensor {name!r} is {t.dtype}, which no TorchLean format holds",
        field=str(name),
        actual=str(t.dtype),
    )


def to_torch(t: StateTensor) -> Any:
    """A CPU tensor owning its memory (safetensors refuses tensors that share storage)."""
    torch = torch_module()
    dtype = _torch_dtype(t.encoding)
    if t.encoding in INTEGER_DTYPES:
        return torch.from_numpy(np.array(t.array, copy=True))
    from ..runtime.binding.tensors import from_host

    return from_host(np.array(t.array, copy=True), dtype)


# --------------------------------------------------------------------------- exact casts


def _mismatch(a: np.ndarray, b: np.ndarray) -> int | None:
    """Index of the first element whose bytes differ, or ``None``."""
    n = a.size
    if n == 0:
        return None
    x = np.ascontiguousarray(a).reshape(n, -1).view(np.uint8).reshape(n, -1)
    y = np.ascontiguousarray(b).reshape(n, -1).view(np.uint8).reshape(n, -1)
    diff = np.flatnonzero((x != y).any(axis=1))
    return int(diff[0]) if diff.size else None


def _inexact(t: StateTensor, index: int, target: str, element: int | None) -> ConfigError:
    where = ""
    if element is not None and t.array.dtype.kind in "fciub":
        value = t.array.reshape(-1)[element].item()
        where = f" (first: element {element} = {value!r})"
    return ConfigError(
        f"{label(t, index)} ({t.encoding}) has values that {target} cannot hold exactly{where}",
        field=t.name or f"tensors[{index}]",
        actual=t.encoding,
        expected=target,
    )


def _native(encoding: str) -> np.dtype | None:
    fmt = ENCODINGS.get(encoding)
    return None if fmt is None or fmt.native_dtype is None else np.dtype(fmt.native_dtype)


def exact_cast(t: StateTensor, index: int, target: str) -> np.ndarray:
    """``t``'s values as arrays of the ``target`` encoding, exactly, or raise.

    Raises:
        ConfigError: complex into real (or back), an encoding without a conversion, or a
            value that does not convert exactly both ways (named, with its position).
    """
    if t.encoding == target or (
        encoding_by_name(t.encoding) is not None
        and encoding_by_name(t.encoding) == encoding_by_name(target)
    ):
        return t.array
    src_fmt, dst_fmt = encoding_by_name(t.encoding), encoding_by_name(target)
    if dst_fmt is None:
        raise ConfigError(f"unknown target encoding {target!r}", field="encoding", actual=target)
    if src_fmt is not None and src_fmt.pair != dst_fmt.pair:
        raise ConfigError(
            f"{label(t, index)} is {t.encoding}: complex and real values do not convert"
            f" into each other ({target} requested)",
            field=t.name or f"tensors[{index}]",
            actual=t.encoding,
            expected=target,
        )
    src_native, dst_native = _native(t.encoding), _native(target)
    if src_native is not None and dst_native is not None:
        with np.errstate(all="ignore"):
            out = t.array.astype(dst_native)
            back = out.astype(src_native)
        bad = _mismatch(t.array, back)
        if bad is not None:
            raise _inexact(t, index, target, bad)
        return out
    # Words (bfloat16, float8, complex32) and integers: torch knows these types.
    from ..runtime.binding.tensors import to_file_dtype, to_host

    source = to_torch(t)
    dtype = _torch_dtype(target)
    if t.encoding in INTEGER_DTYPES:
        try:
            return to_host(to_file_dtype(source, dtype, t.name or f"tensors[{index}]"))
        except ConfigError:
            raise _inexact(t, index, target, None) from None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "ComplexHalf support is experimental"
            out = source.to(dtype)
            back = out.to(source.dtype)
    except (RuntimeError, TypeError) as exc:  # a pair of dtypes torch cannot convert on CPU
        raise ConfigError(
            f"{label(t, index)}: torch cannot convert {t.encoding} to {target}: {exc}",
            field=t.name or f"tensors[{index}]",
            actual=t.encoding,
            expected=target,
        ) from None
    bad = _mismatch(to_host(source), to_host(back))
    if bad is not None:
        raise _inexact(t, index, target, bad)
    return to_host(out)

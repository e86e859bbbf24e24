"""Torch dtypes ↔ file scalar types, host views of tensors, and exact conversions.

The codec speaks numpy: native arrays where numpy has the dtype, storage words otherwise
(uint16 for bfloat16, uint8 for float8, uint16 pairs for complex32). This module turns CPU
tensors into those arrays and back without changing a bit, and decides when a tensor of
another dtype (BatchNorm's int64 ``num_batches_tracked``) may travel in the file's scalar type:
only when the conversion is exact both ways.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ...codec.errors import CheckpointError, ConfigError

__all__ = [
    "ENCODING_OF_DTYPE",
    "HostBuffer",
    "encoding_of",
    "file_dtype_of",
    "check_convertible",
    "from_host",
    "is_floating",
    "to_host",
    "to_file_dtype",
    "from_file_dtype",
    "torch_dtype_of",
]

#: The exact-bits JSON encoding (FORMAT.md §5 short name) of every torch dtype it can hold.
ENCODING_OF_DTYPE: dict[torch.dtype, str] = {
    torch.float64: "float64",
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float8_e4m3fn: "float8_e4m3fn",
    torch.float8_e5m2: "float8_e5m2",
    torch.float8_e4m3fnuz: "float8_e4m3fnuz",
    torch.float8_e5m2fnuz: "float8_e5m2fnuz",
    torch.complex32: "complex32",
    torch.complex64: "complex64",
    torch.complex128: "complex128",
}

# Dtypes numpy holds natively share memory with the tensor; the others travel as words.
_NATIVE = {torch.float64, torch.float32, torch.float16, torch.complex64, torch.complex128}
_WORD_VIEW = {  # torch dtype → (same-width signed torch view, unsigned numpy word dtype)
    torch.bfloat16: (torch.int16, np.uint16),
    torch.float8_e4m3fn: (torch.uint8, np.uint8),
    torch.float8_e5m2: (torch.uint8, np.uint8),
    torch.float8_e4m3fnuz: (torch.uint8, np.uint8),
    torch.float8_e5m2fnuz: (torch.uint8, np.uint8),
}
_SIGNED_OF_WORD = {np.dtype(np.uint16): np.int16, np.dtype(np.uint8): np.uint8}


def is_floating(dtype: torch.dtype) -> bool:
    """Floating or complex: a dtype that decides a file's scalar type."""
    return dtype.is_floating_point or dtype.is_complex


def encoding_of(dtype: torch.dtype, what: str) -> str:
    """The exact-bits JSON encoding for ``dtype``.

    Raises:
        ConfigError: torch has the dtype but no TorchLean format holds it.
    """
    try:
        return ENCODING_OF_DTYPE[dtype]
    except KeyError:
        known = ", ".join(str(d).removeprefix("torch.") for d in ENCODING_OF_DTYPE)
        raise ConfigError(
            f"{what}: no exact-bits format holds {dtype}; supported: {known}",
            actual=str(dtype),
        ) from None


def file_dtype_of(named: Sequence[tuple[str, torch.Tensor]]) -> torch.dtype | None:
    """The one floating dtype of a model's state, or ``None`` if it has no floating tensor.

    Raises:
        ConfigError: the state mixes floating dtypes (the message names a tensor of each).
    """
    floating = {d for d in {t.dtype for _, t in named} if is_floating(d)}
    if len(floating) < 2:
        return next(iter(floating), None)
    first: dict[torch.dtype, str] = {}
    for name, t in named:
        if t.dtype in floating:
            first.setdefault(t.dtype, name)
    if len(first) > 1:
        listed = ", ".join(f"{n!r} is {str(d).removeprefix('torch.')}" for d, n in first.items())
        raise ConfigError(
            f"the state mixes floating dtypes ({listed}); one file holds one scalar type",
            actual=[str(d) for d in first],
        )
    return next(iter(first), None)


def to_host(t: torch.Tensor) -> np.ndarray:
    """The codec's array for a CPU tensor, sharing memory where the layout allows.

    Native dtypes give a numpy array of the same dtype; bfloat16 and float8 give their
    unsigned storage words; complex32 gives uint16 words with a trailing axis of 2.
    """
    t = t.detach()
    if t.dtype in _NATIVE:
        return t.numpy()
    if t.dtype in _WORD_VIEW:
        signed, word = _WORD_VIEW[t.dtype]
        return t.contiguous().view(signed).numpy().view(word)
    if t.dtype == torch.complex32:
        pairs = torch.view_as_real(t.contiguous())  # float16 (..., 2): re, im
        return pairs.view(torch.int16).numpy().view(np.uint16)
    raise ConfigError(f"no host representation for {t.dtype}", actual=str(t.dtype))


def from_host(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """A CPU tensor of ``dtype`` over the codec's array ``a`` (the inverse of :func:`to_host`)."""
    a = np.require(a, requirements="C")  # unlike ascontiguousarray, keeps rank 0
    if dtype in _NATIVE:
        return torch.from_numpy(a)
    if dtype in _WORD_VIEW:
        # torch.from_numpy has no uint16; the signed twin has the same bits.
        return torch.from_numpy(a.view(_SIGNED_OF_WORD[a.dtype])).view(dtype)
    if dtype == torch.complex32:
        half = torch.from_numpy(a.view(np.int16)).view(torch.float16)
        return torch.view_as_complex(half)
    raise ConfigError(f"no host representation for {dtype}", actual=str(dtype))


def _integral_values(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """``values`` (a floating file type) as ``dtype`` if every value is exactly one of
    ``dtype``'s, else ``None``. Range is checked before converting: float→int conversion of
    an out-of-range value is undefined behaviour in C++."""
    if values.is_complex():
        if values.imag.count_nonzero().item():
            return None
        values = values.real
    wide = values.to(torch.float64)  # exact for every floating type up to binary64
    if dtype == torch.bool:
        lo, hi = 0.0, 2.0
    else:
        info = torch.iinfo(dtype)
        lo, hi = float(info.min), float(info.max) + 1.0  # hi rounds to a power of two: exact
    ok = torch.isfinite(wide) & (wide == torch.trunc(wide)) & (wide >= lo) & (wide < hi)
    if not bool(ok.all()):
        return None
    return wide.to(dtype)


def _conversion_error(
    kind: type[CheckpointError], message: str, name: str, actual: torch.dtype, expected: torch.dtype
) -> CheckpointError:
    """A refused conversion of tensor ``name``, with both dtypes as the error's fields."""
    return kind(message, field=name, actual=str(actual), expected=str(expected))


def check_convertible(dtype: torch.dtype, file_dtype: torch.dtype, name: str) -> None:
    """Raise unless a tensor of ``dtype`` may travel in ``file_dtype`` at all.

    Only integer and bool tensors are converted (and only when each value is exact);
    another floating dtype would be a silent rounding.

    Raises:
        ConfigError: naming the tensor and both dtypes.
    """
    if dtype != file_dtype and (is_floating(dtype) or not _is_integer_like(dtype)):
        raise _conversion_error(
            ConfigError,
            f"tensor {name!r} is {dtype}; the file holds {file_dtype} and only integer or"
            " bool tensors are converted (exactly)",
            name,
            dtype,
            file_dtype,
        )


def to_file_dtype(t: torch.Tensor, file_dtype: torch.dtype, name: str) -> torch.Tensor:
    """``t`` converted to ``file_dtype`` (``t`` itself when it already has it), exactly.

    Raises:
        ConfigError: a floating tensor of another dtype, a non-numeric dtype, or an integer
            value the file's type cannot hold exactly (the message names the tensor).
    """
    if t.dtype == file_dtype:
        return t
    check_convertible(t.dtype, file_dtype, name)
    converted = t.detach().to(file_dtype)
    back = _integral_values(converted, t.dtype)
    if back is None or not torch.equal(back, t.detach()):
        raise _conversion_error(
            ConfigError,
            f"tensor {name!r} ({t.dtype}) has values that {file_dtype} cannot hold exactly",
            name,
            t.dtype,
            file_dtype,
        )
    return converted


def from_file_dtype(values: torch.Tensor, dtype: torch.dtype, name: str) -> torch.Tensor:
    """File values (a CPU tensor of the file's type) as ``dtype``, exactly.

    Raises:
        CheckpointError: a value is not exactly one of ``dtype``'s (naming the tensor).
    """
    if values.dtype == dtype:
        return values
    converted = _integral_values(values, dtype) if _is_integer_like(dtype) else None
    if converted is None:
        raise _conversion_error(
            CheckpointError,
            f"tensor {name!r}: the file's {values.dtype} values are not exactly representable"
            f" in the destination's {dtype}",
            name,
            values.dtype,
            dtype,
        )
    return converted


def _is_integer_like(dtype: torch.dtype) -> bool:
    if dtype == torch.bool:
        return True
    if dtype.is_floating_point or dtype.is_complex:
        return False
    try:
        torch.iinfo(dtype)
    except TypeError:  # quantized and other non-numeric dtypes
        return False
    return True


_TORCH_OF_NUMPY = {
    np.dtype("<f4"): torch.float32,
    np.dtype("<f8"): torch.float64,
}


class HostBuffer:
    """One reusable host buffer, pinned when it feeds or drains a CUDA device.

    It grows to the largest payload requested and is reused for every other, so a load or
    save holds at most one tensor's payload in host memory beyond the model itself.
    """

    def __init__(self, pin: bool = False):
        self._pin = pin and torch.cuda.is_available()
        self._raw: torch.Tensor | None = None

    def tensor(self, count: int, dtype: torch.dtype) -> torch.Tensor:
        """A flat CPU tensor of ``count`` elements of ``dtype`` over the buffer (contents
        undefined); valid until the next call."""
        nbytes = count * torch.empty((), dtype=dtype).element_size()
        if self._raw is None or self._raw.numel() < nbytes:
            self._raw = None  # release the smaller buffer before allocating the larger
            self._raw = torch.empty(max(nbytes, 1), dtype=torch.uint8, pin_memory=self._pin)
        return self._raw[:nbytes].view(dtype)

    def array(self, count: int, dtype: np.dtype) -> np.ndarray:
        """The same buffer as a numpy array (for the codec's ``readinto``)."""
        return self.tensor(count, _TORCH_OF_NUMPY[np.dtype(dtype)]).numpy()


def torch_dtype_of(dtype: np.dtype) -> torch.dtype:
    """The torch twin of a codec payload dtype (float32 / float64)."""
    return _TORCH_OF_NUMPY[np.dtype(dtype)]

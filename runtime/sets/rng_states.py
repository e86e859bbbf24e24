"""The global random states of a checkpoint set, checked whole and made ready to install
(a restore with ``rng=True``); the installing itself is the commit's.

numpy's and ``random``'s states are checked by :mod:`tlckpt.codec.sets.rng_states` (the document
parser already did; checked again here, cheaply, for a state built by other means). torch's
are byte strings in torch's own layouts:

* the CPU generator's (``torch.get_rng_state()``, 5056 bytes): torch checks only that the
  position fields are in range, not that they agree, and a state whose ``left`` and ``next``
  disagree makes the generator read past its 624 words (memory outside it, silently); its
  flags are C++ ``bool``s read from raw bytes. So every field is checked against what torch
  itself writes, and the state must read back from a scratch generator byte for byte;
* a CUDA device's (Philox: seed and offset): the length the device's own state has, and it
  must read back from a scratch generator on that device byte for byte.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np
import torch

from ...codec.errors import ConfigError, MalformedError
from ...codec.sets.rng_states import MT_WORDS, check_numpy_state

__all__ = ["CPU_STATE_BYTES", "cpu_state", "cuda_states", "numpy_state"]

#: The size of torch's ``CPUGeneratorImplState`` (the layout below); a torch with another
#: size has changed the layout, and its states are refused rather than trusted.
CPU_STATE_BYTES = 5056

# CPUGeneratorImplState = {CPUGeneratorImplStateLegacy legacy_pod; float
# next_float_normal_sample; bool is_next_float_normal_sample_valid;}, where the legacy pod is
# {u64 the_initial_seed; i32 left; i32 seeded; u64 next; u64 state[624]; f64 normal_x,
# normal_y, normal_rho; i32 normal_is_valid;} (native byte order, C alignment).
_HEAD = struct.Struct("=QiiQ")
_WORDS = struct.Struct(f"={MT_WORDS}Q")
_NORMALS = struct.Struct("=dddi")
_FLOAT_NORMAL = struct.Struct("=f?")
_WORDS_AT = _HEAD.size
_NORMALS_AT = _WORDS_AT + _WORDS.size
_FLOAT_NORMAL_AT = _NORMALS_AT + _NORMALS.size + 4  # the legacy pod's tail padding


def _malformed(field: str, message: str) -> MalformedError:
    return MalformedError(f"{field}: {message}", field=field)


def _check_cpu_fields(data: bytes, field: str) -> None:
    """Every field of a CPU generator state, before any generator reads it."""
    _, left, seeded, position = _HEAD.unpack_from(data, 0)
    if seeded != 1:
        raise _malformed(field, f"seeded is {seeded}, torch writes 1")
    # A generator draws word ``next`` and counts ``left`` down to its next regeneration:
    # right after seeding (left 1, next 0), or with left + next = 625 (next <= 624). Any
    # other pair passes torch's own check and reads past the 624 words.
    if not ((left, position) == (1, 0) or (1 <= left <= MT_WORDS and left + position == 625)):
        raise _malformed(
            field, f"left {left} and next {position} are not a position the generator reaches"
        )
    if any(word >> 32 for word in _WORDS.unpack_from(data, _WORDS_AT)):
        raise _malformed(field, "a state word does not fit in 32 bits")
    _, normal, _, normal_valid = _NORMALS.unpack_from(data, _NORMALS_AT)
    flag = data[_FLOAT_NORMAL_AT + 4]
    if normal_valid not in (0, 1) or flag not in (0, 1):
        raise _malformed(field, f"a cached-normal flag is {normal_valid}/{flag}, not 0 or 1")
    float_normal = _FLOAT_NORMAL.unpack_from(data, _FLOAT_NORMAL_AT)[0]
    if not (math.isfinite(normal) and math.isfinite(float_normal)):
        raise _malformed(field, "a cached normal sample is not finite")


def _read_back(state: torch.Tensor, generator: torch.Generator, field: str) -> None:
    """``state`` installed on a scratch ``generator`` must read back byte for byte: the bytes
    torch itself would write (padding, unused fields, seeds)."""
    try:
        generator.set_state(state)
    except (RuntimeError, ValueError, TypeError) as exc:
        raise ConfigError(
            f"{field}: torch refuses the saved random state: {exc}", field=field
        ) from None
    if not torch.equal(generator.get_state(), state):
        raise _malformed(field, "the state is not one torch writes (it does not read back)")


def _check_size(data: bytes, expected: int, field: str, what: str) -> None:
    """Refuse a saved state of another length than ``what`` (``expected`` bytes) here."""
    if len(data) != expected:
        raise MalformedError(
            f"{field} has {len(data)} bytes, {what} {expected}",
            field=field,
            actual=len(data),
            expected=expected,
        )


def cpu_state(data: bytes, field: str = "rng.torch") -> torch.Tensor:
    """torch's CPU generator state from the document's bytes, checked whole.

    Raises:
        MalformedError: not the length of this torch's state, or a field outside what torch
            writes (``field`` named).
        ConfigError: this torch's state has another layout (another size), or torch
            refuses the state.
    """
    expected = torch.get_rng_state().numel()
    if expected != CPU_STATE_BYTES:
        raise ConfigError(
            f"this torch's CPU random state has {expected} bytes; tlckpt knows the"
            f" {CPU_STATE_BYTES}-byte layout only, and does not install one it cannot check",
            field=field,
        )
    _check_size(data, expected, field, "torch's CPU random state")
    _check_cpu_fields(data, field)
    state = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    _read_back(state, torch.Generator(), field)
    return state


def cuda_states(saved: list[bytes], field: str = "rng.cuda") -> list[torch.Tensor]:
    """Each CUDA device's generator state, checked on a scratch generator of that device.

    Raises:
        ConfigError: the set holds another number of devices than this process has.
        MalformedError: a state of another length than the device's (the device named), or
            one that does not read back.
    """
    if not saved:
        return []
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count != len(saved):
        raise ConfigError(
            f"the set holds the random states of {len(saved)} CUDA devices, this process has"
            f" {count}",
            field=field,
            actual=count,
            expected=len(saved),
        )
    states = []
    for i, data in enumerate(saved):
        where = f"{field}[{i}]"
        expected = torch.cuda.get_rng_state(i).numel()
        _check_size(data, expected, where, f"CUDA device {i}'s random state")
        state = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        _read_back(state, torch.Generator(device=f"cuda:{i}"), where)
        states.append(state)
    return states


def numpy_state(saved: Any) -> dict[str, Any]:
    """numpy's legacy global state, checked, with its key as the ``uint32`` array numpy
    keeps (``np.random.set_state`` takes it as is)."""
    checked = check_numpy_state(saved)
    checked["state"]["key"] = np.array(checked["state"]["key"], dtype=np.uint32)
    return checked

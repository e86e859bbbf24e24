"""The global random states of a training-state document, checked field by field before
anything installs them (torch-free; the torch generators' byte states are checked by the
runtime, which knows torch's layout).

The generators' own ``set_state`` functions check little, and trust the rest:

* numpy's legacy ``RandomState`` takes any ``pos``: the next draw reads
  ``key[pos]``, so ``pos = 2**31 - 1`` reads far outside the 624-word key and kills the
  process (SIGSEGV); it also takes any ``has_gauss``.
* Python's ``random.setstate`` truncates words beyond 32 bits silently, takes a bool for an
  int, and installs any object as the cached Gaussian (the next ``random.gauss`` returns it).

So a state is accepted only in the exact form the generator itself produces
(``np.random.get_state(legacy=False)`` and ``random.getstate()``): exact types, lengths and
ranges. An all-zero Mersenne Twister state is refused too: the generator would draw zeros
forever (both libraries' seeding avoids it).
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import MalformedError
from .set_document_checks import exact_keys, short

__all__ = ["MT_WORDS", "check_numpy_state", "check_random_state"]

#: The Mersenne Twister's state: 624 32-bit words, and a position in ``[0, 624]`` (624: the
#: words are used up and the next draw regenerates them).
MT_WORDS = 624
_WORD_END = 1 << 32
_UPPER_BIT = 1 << 31

_NUMPY_KEYS = ("bit_generator", "state", "has_gauss", "gauss")
_NUMPY_STATE_KEYS = ("key", "pos")
_RANDOM_VERSION = 3


def _refuse(field: str, message: str, value: Any, expected: str) -> MalformedError:
    return MalformedError(
        f"{field} {message}, got {short(value)}",
        field=field,
        actual=short(value),
        expected=expected,
    )


def _index(value: Any, field: str) -> int:
    if type(value) is not int or not 0 <= value <= MT_WORDS:
        raise _refuse(field, f"must be an integer in [0, {MT_WORDS}]", value, f"[0, {MT_WORDS}]")
    return value


def _words(words: Any, field: str) -> list[int]:
    """The 624 key words: each an ``int`` (not a bool) in ``[0, 2**32)``, not all zero."""
    for i, word in enumerate(words):
        if type(word) is not int or not 0 <= word < _WORD_END:
            raise _refuse(f"{field}[{i}]", "must be an integer in [0, 2**32)", word, "u32")
    # The state is the top bit of word 0 and the other 623 words: all zero is the one
    # state the Mersenne Twister never leaves.
    if not words[0] & _UPPER_BIT and not any(words[1:]):
        raise MalformedError(
            f"{field} is the all-zero Mersenne Twister state (every draw would be 0)",
            field=field,
            expected="a state the generator can reach",
        )
    return list(words)


def check_numpy_state(value: Any, field: str = "rng.numpy") -> dict[str, Any]:
    """numpy's legacy global generator's state, as ``np.random.get_state(legacy=False)``
    gives it (arrays as lists).

    Args:
        value: the decoded document value.
        field: its path, for errors.

    Returns:
        A fresh ``{"bit_generator": "MT19937", "state": {"key": [624 ints], "pos": int},
        "has_gauss": 0 | 1, "gauss": float}``.

    Raises:
        MalformedError: a key missing or unknown, another bit generator, a key not of 624
            words in ``[0, 2**32)`` (or all zero), ``pos`` outside ``[0, 624]``,
            ``has_gauss`` not 0 or 1, ``gauss`` not a finite float (the field named).
    """
    if type(value) is not dict:
        raise _refuse(field, "must be an object", value, "object")
    # First: another bit generator (np.random.set_bit_generator) has other keys, and this
    # is the reason to name. Its states are not checked here, so they are refused.
    if value.get("bit_generator") != "MT19937":
        raise _refuse(
            f"{field}.bit_generator",
            "must be 'MT19937': numpy's legacy global generator, the one tlckpt saves and"
            " restores (np.random.set_bit_generator with another is not supported)",
            value.get("bit_generator"),
            "MT19937",
        )
    exact_keys(value, _NUMPY_KEYS, field)
    state = value["state"]
    if type(state) is not dict:
        raise _refuse(f"{field}.state", "must be an object", state, "object")
    exact_keys(state, _NUMPY_STATE_KEYS, f"{field}.state")
    key = state["key"]
    if type(key) is not list or len(key) != MT_WORDS:
        shape = f"a list of {len(key)}" if type(key) is list else type(key).__name__
        raise MalformedError(
            f"{field}.state.key must be a list of {MT_WORDS} words, got {shape}",
            field=f"{field}.state.key",
            expected=f"{MT_WORDS} words",
        )
    words = _words(key, f"{field}.state.key")
    pos = _index(state["pos"], f"{field}.state.pos")
    has_gauss = value["has_gauss"]
    if type(has_gauss) is not int or has_gauss not in (0, 1):
        raise _refuse(f"{field}.has_gauss", "must be 0 or 1", has_gauss, "0 or 1")
    gauss = value["gauss"]
    if type(gauss) is not float or not math.isfinite(gauss):
        raise _refuse(f"{field}.gauss", "must be a finite float", gauss, "finite float")
    return {
        "bit_generator": "MT19937",
        "state": {"key": words, "pos": pos},
        "has_gauss": has_gauss,
        "gauss": gauss,
    }


def check_random_state(value: Any, field: str = "rng.random") -> tuple[int, tuple[int, ...], Any]:
    """Python's ``random`` module state, as ``random.getstate()`` gives it.

    Args:
        value: the decoded document value.
        field: its path, for errors.

    Returns:
        ``(3, (624 words..., position), gauss_next)``, with ``gauss_next`` ``None`` or a
        finite float.

    Raises:
        MalformedError: not a 3-tuple of version 3; the internal state not a tuple of 625
            integers, words in ``[0, 2**32)`` (not all zero) and the last in ``[0, 624]``;
            a cached Gaussian that is not ``None`` or a finite float (the field named).
    """
    if type(value) is not tuple or len(value) != 3:
        raise _refuse(field, "must be a tuple (version, state, gauss_next)", value, "3-tuple")
    version, internal, gauss_next = value
    if type(version) is not int or version != _RANDOM_VERSION:
        raise _refuse(f"{field}[0]", "(the version) must be 3", version, "3")
    if type(internal) is not tuple or len(internal) != MT_WORDS + 1:
        shape = f"a tuple of {len(internal)}" if type(internal) is tuple else short(internal)
        raise MalformedError(
            f"{field}[1] must be a tuple of {MT_WORDS + 1} integers, got {shape}",
            field=f"{field}[1]",
            expected=f"{MT_WORDS + 1} integers",
        )
    words = _words(internal[:MT_WORDS], f"{field}[1]")
    position = _index(internal[MT_WORDS], f"{field}[1][{MT_WORDS}]")
    if gauss_next is not None and (type(gauss_next) is not float or not math.isfinite(gauss_next)):
        raise _refuse(f"{field}[2]", "(gauss_next) must be None or a finite float", gauss_next, "")
    return (_RANDOM_VERSION, (*words, position), gauss_next)

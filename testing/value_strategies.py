"""Hypothesis strategies for the values of a training-state document.

The values a training-state document holds (a scheduler's state, ``extra``): every kind
:mod:`tlckpt.codec.sets.exact_values` takes, with floats drawn as raw binary64 words (NaN
payloads, -0.0, infinities, subnormals), integers up to and just past the reader's digit
bound, strings of any code point but lone surrogates, and containers nested up to and just
past ``LIMITS.value_depth``.
"""

from __future__ import annotations

import collections
import struct
from typing import Any

from hypothesis import strategies as st

from ..codec.sets.exact_values import TensorScalar
from ..formats.checkpoint_set import LIMITS
from .strategies import SPECIAL_FLOAT64_WORDS, U64_MAX

__all__ = [
    "value_floats",
    "value_integers",
    "value_strings",
    "hashable_values",
    "nested_values",
    "training_values",
    "beyond_leaves",
    "value_depth",
    "value_fits",
    "same_value",
]


def _float_of_word(word: int) -> float:
    return struct.unpack("<d", struct.pack("<Q", word))[0]


def value_floats() -> st.SearchStrategy[float]:
    """binary64 values of every kind, the special words forced often."""
    return st.one_of(
        st.sampled_from(SPECIAL_FLOAT64_WORDS).map(_float_of_word),
        st.integers(0, U64_MAX).map(_float_of_word),
        st.floats(allow_nan=True, allow_infinity=True),
    )


def value_integers(digits: int | None = None) -> st.SearchStrategy[int]:
    """Integers around JSON's 64-bit range and up to ``digits`` decimal digits (default:
    the table's ``LIMITS.int_digits``), the bounds themselves included."""
    digits = LIMITS.int_digits if digits is None else digits
    top = 10**digits - 1
    return st.one_of(
        st.integers(-(2**63) - 2, U64_MAX + 2),
        st.integers(-top, top),
        st.sampled_from((-top, top, -(2**63), -(2**63) - 1, U64_MAX, U64_MAX + 1)),
    )


def value_strings(max_size: int = 8) -> st.SearchStrategy[str]:
    """Strings of any code point that UTF-8 holds (none of the lone surrogates), "$" keys
    that look like tags among them."""
    return st.one_of(
        st.text(max_size=max_size),
        st.sampled_from(("$float", "$dict", "$", "note")),
    )


def hashable_values() -> st.SearchStrategy[Any]:
    """Values that can be dict keys and set items: scalars, tuples and frozensets of them,
    zero-dimensional tensor stand-ins."""
    scalars = st.one_of(
        st.none(), st.booleans(), value_integers(40), value_floats(), value_strings()
    )
    return st.recursive(
        scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=3).map(tuple),
            st.frozensets(inner, max_size=3),
        ),
        max_leaves=6,
    )


def _tensor_scalars() -> st.SearchStrategy[TensorScalar]:
    return st.one_of(
        st.builds(
            TensorScalar, st.sampled_from(("float32", "float64", "bfloat16")), value_floats()
        ),
        st.builds(TensorScalar, st.just("int64"), st.integers(-(2**63), 2**63 - 1)),
        st.builds(TensorScalar, st.just("bool"), st.booleans()),
    )


def beyond_leaves() -> st.SearchStrategy[Any]:
    """Leaves no reader takes: integers of one digit more than ``LIMITS.int_digits``,
    strings holding a lone surrogate (UTF-8 has none)."""
    past = 10**LIMITS.int_digits
    return st.one_of(
        # Drawn by index: hypothesis' repr of such integers is refused by Python itself.
        st.integers(0, 2).map(lambda i: (past, -past, past * 7 + 3)[i]),
        st.builds(
            lambda head, surrogate: head + surrogate,
            st.text(max_size=3),
            st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),
        ),
    )


def _leaves(beyond: bool = False) -> st.SearchStrategy[Any]:
    leaves = st.one_of(
        st.none(),
        st.booleans(),
        value_integers(),
        value_floats(),
        value_strings(),
        _tensor_scalars(),
    )
    return st.one_of(leaves, beyond_leaves()) if beyond else leaves


_FACTORIES = (None, int, float, list, dict, collections.Counter, collections.deque)


def _wrap(draw: st.DrawFn, inner: Any) -> Any:
    """``inner`` inside one container of a drawn kind (it becomes one level deeper)."""
    kind = draw(st.integers(0, 11))
    if kind == 0:
        return [inner]
    if kind == 1:
        return (inner,)
    if kind == 2:
        return {draw(value_strings()): inner}
    if kind == 3:
        return {draw(st.integers(-3, 3)): inner}  # int-keyed: written as "$dict"
    if kind == 4:
        return collections.OrderedDict([(draw(hashable_values()), inner)])
    if kind == 5:
        return collections.Counter({draw(hashable_values()): inner})
    if kind == 6:
        maxlen = draw(st.one_of(st.none(), st.integers(1, 3)))
        return collections.deque([inner], maxlen)
    if kind == 7:
        table = collections.defaultdict(draw(st.sampled_from(_FACTORIES)))
        table[draw(hashable_values())] = inner
        return table
    if kind == 8:
        try:
            hash(inner)
        except TypeError:
            return [inner]
        return draw(st.sampled_from((set, frozenset)))([inner])
    if kind == 9:
        return {"$tuple": inner}  # a plain key that looks like a tag
    if kind == 10:
        return [draw(_leaves()), inner]
    return {"a": draw(_leaves()), "b": inner}


@st.composite
def nested_values(draw: st.DrawFn, depth: int) -> Any:
    """A value whose containers nest exactly ``depth`` deep (``0``: a leaf), each level a
    drawn kind of container: list, tuple, str- and int-keyed dict, ``OrderedDict``,
    ``Counter``, ``deque``, ``defaultdict``, ``set``/``frozenset``."""
    value = draw(_leaves())
    for _ in range(depth):
        value = _wrap(draw, value)
    return value


def training_values(max_leaves: int = 24, beyond: bool = False) -> st.SearchStrategy[Any]:
    """Values of every kind a training-state document takes, shallow and wide; with
    ``beyond``, some leaves are :func:`beyond_leaves` (see :func:`value_fits`)."""

    def containers(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        keys = hashable_values()
        return st.one_of(
            st.lists(inner, max_size=4),
            st.lists(inner, max_size=4).map(tuple),
            st.dictionaries(value_strings(), inner, max_size=4),
            st.dictionaries(st.integers(-5, 5), inner, max_size=4),
            st.dictionaries(keys, inner, max_size=3),
            st.dictionaries(keys, inner, max_size=3).map(collections.OrderedDict),
            st.dictionaries(keys, inner, max_size=3).map(collections.Counter),
            st.builds(
                lambda items, maxlen: collections.deque(
                    items, None if maxlen is None else len(items) + maxlen
                ),
                st.lists(inner, max_size=3),
                st.one_of(st.none(), st.integers(0, 2)),
            ),
            st.builds(
                lambda factory, items: collections.defaultdict(factory, items),
                st.sampled_from(_FACTORIES),
                st.dictionaries(keys, inner, max_size=3),
            ),
            st.sets(keys, max_size=3),
            st.frozensets(keys, max_size=3),
        )

    return st.recursive(_leaves(beyond), containers, max_leaves=max_leaves)


def value_depth(value: Any) -> int:
    """How deep ``value``'s containers nest (``0`` for a leaf, ``1`` for ``[1]``): the
    measure ``LIMITS.value_depth`` bounds, keys and set items included."""
    if isinstance(value, (list, tuple, collections.deque, set, frozenset)):
        return 1 + max((value_depth(v) for v in value), default=0)
    if isinstance(value, dict):
        inner = [value_depth(x) for pair in value.items() for x in pair]
        return 1 + max(inner, default=0)
    return 0


def value_fits(value: Any) -> bool:
    """Whether every reader of a training-state document takes ``value`` (an independent
    statement of the bounds, for the property tests): containers at most
    ``LIMITS.value_depth`` deep, integers of at most ``LIMITS.int_digits`` digits, strings
    that UTF-8 holds, keys and set items included."""
    if value_depth(value) > LIMITS.value_depth:
        return False
    stack = [value]
    while stack:
        item = stack.pop()
        if type(item) is int and abs(item) >= 10**LIMITS.int_digits:
            return False
        if type(item) is str and any(0xD800 <= ord(c) <= 0xDFFF for c in item):
            return False
        if type(item) is TensorScalar:
            stack.append(item.value)
        elif isinstance(item, dict):
            stack.extend(x for pair in item.items() for x in pair)
        elif isinstance(item, (list, tuple, collections.deque, set, frozenset)):
            stack.extend(item)
    return True


def _bits_equal(a: float, b: float) -> bool:
    return struct.pack("<d", a) == struct.pack("<d", b)


def same_value(a: Any, b: Any) -> bool:
    """Whether ``b`` is ``a`` exactly: the same types at every level, floats bit for bit,
    mappings' keys in the same order, a deque's ``maxlen`` and a defaultdict's factory."""
    if type(a) is not type(b):
        return False
    if type(a) is float:
        return _bits_equal(a, b)
    if type(a) is TensorScalar:
        return a.dtype == b.dtype and same_value(a.value, b.value)
    if isinstance(a, (list, tuple, collections.deque)):
        if type(a) is collections.deque and a.maxlen != b.maxlen:
            return False
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        if type(a) is collections.defaultdict and a.default_factory is not b.default_factory:
            return False
        return len(a) == len(b) and all(
            same_value(ka, kb) and same_value(va, vb)
            for (ka, va), (kb, vb) in zip(a.items(), b.items())
        )
    if isinstance(a, (set, frozenset)):
        # No order to keep: every item of one has an exactly equal item in the other.
        return len(a) == len(b) and all(any(same_value(x, y) for y in b) for x in a)
    return a == b

"""The optimizer-tree document (:mod:`tlckpt.formats.optimizer_tree`): built for the writer,
parsed and checked whole for the reader (numpy and torch free).

:func:`build_document` turns what the runtime collected — the optimizer's class, its groups
(parameter names, dtypes, shapes, options) and its state with tensors replaced by
placeholders — into the ``__metadata__`` text; every value is encoded exactly or refused
(naming its path) before anything is written. :func:`parse_document` is its inverse for a
header read from a possibly hostile file: the entry must be there, be JSON without duplicate
keys, have exactly the documented members of the documented types, name each of the file's
tensors exactly once, place each placeholder once, and hold state only for parameters its
groups name. What it returns can be trusted structurally; whether it fits a live optimizer is
the runtime's check.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from ...formats.optimizer_tree import (
    CLASS_MEMBER,
    COUNTER_MEMBER,
    DOCUMENT_KEY,
    DOCUMENT_KEYS,
    FORMAT_MEMBER,
    FORMAT_TAG,
    GROUP_KEYS,
    GROUPS_MEMBER,
    OPTIONS_MEMBER,
    PARAMS_MEMBER,
    STATE_MEMBER,
    TENSOR_PLACEHOLDER,
    TENSORS_MEMBER,
    VERSION,
    VERSION_MEMBER,
)
from ...formats.safetensors import DTYPE_BY_NAME, METADATA_KEY
from ..errors import (
    MalformedError,
    SchemaMismatchError,
)
from ..exact_json.json_document import parse_embedded_json
from ..safetensors.header import Header
from ..sets.exact_values import TensorScalar, decode_value, encode_value, json_path
from ..sets.set_document_checks import check_format

__all__ = [
    "GroupRecord",
    "TreeDocument",
    "build_document",
    "parse_document",
    "placeholder",
    "is_placeholder",
    "has_document",
]

_FIELD = f"{METADATA_KEY}.{DOCUMENT_KEY}"


@dataclass(frozen=True)
class GroupRecord:
    """One param group as the file holds it.

    Attributes:
        params: ``(name, dtype word, shape)`` of each parameter, in the group's order.
        options: every other group key → its value (tensor options as placeholders).
    """

    params: tuple[tuple[str, str, tuple[int, ...]], ...]
    options: dict[str, Any]

    @property
    def names(self) -> tuple[str, ...]:
        """The parameters' names, in order."""
        return tuple(p[0] for p in self.params)


@dataclass(frozen=True)
class TreeDocument:
    """A checked document.

    Attributes:
        optimizer_class: ``module.qualname`` of the optimizer that wrote it.
        random_counter: the run's random counter, or ``None``.
        tensors: the file's tensor names; placeholder ``i`` stands for ``tensors[i]``.
        groups: the param groups, in order.
        state: parameter name → its state (placeholders where tensors are).
    """

    optimizer_class: str
    random_counter: int | None
    tensors: tuple[str, ...]
    groups: tuple[GroupRecord, ...]
    state: dict[str, dict[str, Any]]


def placeholder(index: int) -> TensorScalar:
    """The value standing for ``tensors[index]`` in a document."""
    return TensorScalar(TENSOR_PLACEHOLDER, index)


def is_placeholder(value: Any) -> bool:
    """Whether ``value`` is a placeholder (of a decoded document; its index is checked)."""
    return type(value) is TensorScalar and value.dtype == TENSOR_PLACEHOLDER


def has_document(header: Header) -> bool:
    """Whether the header's metadata holds an optimizer-tree document."""
    return DOCUMENT_KEY in (header.metadata or {})


def build_document(
    optimizer_class: str,
    tensors: Sequence[str],
    groups: Sequence[GroupRecord],
    state: Mapping[str, Mapping[str, Any]],
    random_counter: int | None = None,
) -> dict[str, str]:
    """The ``__metadata__`` of a file (its one entry).

    Raises:
        CheckpointError: a value the tagged JSON cannot hold exactly (an object, a NumPy
            scalar, a lone surrogate, too deep), naming its path; nothing is written yet.
    """
    document = {
        FORMAT_MEMBER: FORMAT_TAG,
        VERSION_MEMBER: VERSION,
        CLASS_MEMBER: optimizer_class,
        COUNTER_MEMBER: random_counter,
        TENSORS_MEMBER: list(tensors),
        GROUPS_MEMBER: [
            {
                PARAMS_MEMBER: [[n, d, list(s)] for n, d, s in g.params],
                OPTIONS_MEMBER: dict(g.options),
            }
            for g in groups
        ],
        STATE_MEMBER: {name: dict(values) for name, values in state.items()},
    }
    encoded = encode_value(document, ())
    return {DOCUMENT_KEY: orjson.dumps(encoded).decode()}


def _malformed(field: str, message: str, actual: Any = None) -> MalformedError:
    return MalformedError(f"{field}: {message}", field=field, actual=actual)


def _str_list(value: Any, field: str) -> list[str]:
    if type(value) is not list or not all(type(v) is str for v in value):
        raise _malformed(field, "must be a list of strings")
    return value


def _param(value: Any, field: str) -> tuple[str, str, tuple[int, ...]]:
    ok = type(value) is list and len(value) == 3 and type(value[0]) is str
    ok = ok and type(value[1]) is str and value[1] in DTYPE_BY_NAME and type(value[2]) is list
    if not ok or not all(type(d) is int and d >= 0 for d in value[2]):
        raise _malformed(field, "must be [name, safetensors dtype, [dims]]", actual=value)
    return value[0], value[1], tuple(value[2])


def _group(value: Any, field: str) -> GroupRecord:
    if type(value) is not dict or set(value) != set(GROUP_KEYS):
        raise _malformed(field, f"must be an object of {', '.join(GROUP_KEYS)}")
    params = value[PARAMS_MEMBER]
    if type(params) is not list:
        raise _malformed(f"{field}.{PARAMS_MEMBER}", "must be a list")
    options = value[OPTIONS_MEMBER]
    if type(options) is not dict or not all(type(k) is str for k in options):
        raise _malformed(f"{field}.{OPTIONS_MEMBER}", "must be an object of string keys")
    if PARAMS_MEMBER in options:
        raise _malformed(f"{field}.{OPTIONS_MEMBER}", "holds the group's parameter list")
    return GroupRecord(
        tuple(_param(p, f"{field}.{PARAMS_MEMBER}[{i}]") for i, p in enumerate(params)), options
    )


def _placeholders(value: Any, path: tuple, found: list[tuple[int, tuple]]) -> None:
    """Collect ``(index, path)`` of every placeholder in ``value``; refuse one as a key or a
    set member and any other tagged tensor (a decoded document: its depth is bounded)."""
    if type(value) is TensorScalar:
        if value.dtype != TENSOR_PLACEHOLDER or type(value.value) is not int:
            raise _malformed(
                json_path(path), f"a tagged tensor {value.dtype!r}; only file tensors are held"
            )
        found.append((value.value, path))
        return
    if isinstance(value, dict):
        for i, (k, v) in enumerate(value.items()):
            if _holds_tensor(k):
                raise _malformed(json_path(path), "a tensor as a key")
            _placeholders(v, (*path, k if type(k) in (str, int) else f"<key {i}>"), found)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _placeholders(v, (*path, i), found)
    elif isinstance(value, (set, frozenset)) and any(_holds_tensor(v) for v in value):
        raise _malformed(json_path(path), "a tensor as a set member")


def _holds_tensor(value: Any) -> bool:
    if type(value) is TensorScalar:
        return True
    if isinstance(value, tuple):
        return any(_holds_tensor(v) for v in value)
    if isinstance(value, frozenset):
        return any(_holds_tensor(v) for v in value)
    return False


def parse_document(header: Header) -> TreeDocument:
    """The header's optimizer-tree document, checked whole (see the module docstring).

    Raises:
        MalformedError: no document, not JSON, a duplicate key, a member missing or of the
            wrong type, an unknown tag, a placeholder out of range or used twice.
        UnsupportedFormatError: another format tag.
        UnsupportedVersionError: another version.
        SchemaMismatchError: the document's tensor list and the file's tensors differ, or its
            state names a parameter its groups do not.
    """
    text = (header.metadata or {}).get(DOCUMENT_KEY)
    if text is None:
        raise MalformedError(f"the file has no {_FIELD}: it is not an optimizer tree", field=_FIELD)
    loaded = parse_embedded_json(text, _FIELD)
    document = decode_value(loaded, (DOCUMENT_KEY,))
    if type(document) is not dict or set(document) != set(DOCUMENT_KEYS):
        raise _malformed(_FIELD, f"must be an object of {', '.join(DOCUMENT_KEYS)}")
    check_format(document, FORMAT_TAG, VERSION, "tlckpt optimizer tree", f"{_FIELD}.")
    if type(document[CLASS_MEMBER]) is not str:
        raise _malformed(f"{_FIELD}.{CLASS_MEMBER}", "must be a string")
    counter = document[COUNTER_MEMBER]
    if counter is not None and (type(counter) is not int or counter < 0):
        raise _malformed(f"{_FIELD}.{COUNTER_MEMBER}", "must be null or a non-negative integer")
    tensors = _str_list(document[TENSORS_MEMBER], f"{_FIELD}.{TENSORS_MEMBER}")
    if len(set(tensors)) != len(tensors) or set(tensors) != set(header.entries):
        raise SchemaMismatchError(
            f"{_FIELD}.{TENSORS_MEMBER} lists {len(tensors)} names; the file holds"
            f" {len(header.entries)} tensors (each must be listed exactly once)",
            field=f"{_FIELD}.{TENSORS_MEMBER}",
            actual=sorted(set(tensors) ^ set(header.entries))[:5],
        )
    raw_groups = document[GROUPS_MEMBER]
    if type(raw_groups) is not list:
        raise _malformed(f"{_FIELD}.{GROUPS_MEMBER}", "must be a list")
    groups = tuple(_group(g, f"{_FIELD}.{GROUPS_MEMBER}[{i}]") for i, g in enumerate(raw_groups))
    names = [n for g in groups for n in g.names]
    if len(set(names)) != len(names):
        raise _malformed(f"{_FIELD}.{GROUPS_MEMBER}", "names a parameter twice")
    state = document[STATE_MEMBER]
    if type(state) is not dict or not all(
        type(k) is str and type(v) is dict and all(type(key) is str for key in v)
        for k, v in state.items()
    ):
        raise _malformed(f"{_FIELD}.{STATE_MEMBER}", "must map parameter names to objects")
    unknown = sorted(set(state) - set(names))
    if unknown:
        raise SchemaMismatchError(
            f"{_FIELD}.{STATE_MEMBER} holds parameters no group names: {unknown[:5]}",
            field=f"{_FIELD}.{STATE_MEMBER}",
            actual=unknown[:5],
        )
    found: list[tuple[int, tuple]] = []
    _placeholders([g.options for g in groups], (DOCUMENT_KEY, GROUPS_MEMBER), found)
    _placeholders(state, (DOCUMENT_KEY, STATE_MEMBER), found)
    indexes = sorted(i for i, _ in found)
    if indexes != list(range(len(tensors))):
        raise MalformedError(
            f"{_FIELD}: its placeholders must name tensors 0..{len(tensors) - 1} once each",
            field=_FIELD,
            actual=indexes[:10],
        )
    return TreeDocument(document[CLASS_MEMBER], counter, tuple(tensors), groups, state)

"""The training-state document's writer keeps every bound its reader keeps (issue #20, items
3, 11 and 13), at the document level: ``build_training_state`` → ``parse_training_state``.

* what the writer accepts, the reader reads back exactly (types, order, float bits,
  ``maxlen``, default factories), for generated values of every kind, up to the bounds;
* what the reader would refuse (too deep, too many digits, a lone surrogate, too large a
  document), the writer refuses: a ``CheckpointError`` naming the path, never orjson's
  ``TypeError``;
* depth is counted the same way on both sides: a value exactly as deep as the bound is
  written and read; one level more is refused by the writer, and by the reader when forged;
* the ``collections`` containers of schedulers' states are tagged, and malformed tags are
  refused.
"""

from __future__ import annotations

import collections
import dataclasses
import sys
from typing import Any

import numpy as np
import orjson
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tlckpt.codec import CheckpointError, FileTooLargeError, MalformedError
from tlckpt.codec.sets.exact_values import TensorScalar, decode_value, encode_value
from tlckpt.codec.sets.set_document_writing import build_manifest, build_training_state
from tlckpt.codec.sets.set_documents import MemberRecord, parse_manifest, parse_training_state
from tlckpt.formats import checkpoint_set as layout
from tlckpt.formats.checkpoint_set import LIMITS, MAX_TRAINING_STATE_BYTES
from tlckpt.testing.value_strategies import (
    nested_values,
    same_value,
    training_values,
    value_depth,
    value_fits,
)

DEPTH = LIMITS.value_depth


def _document(extra: Any, scheduler: Any = None) -> bytes:
    return build_training_state(3, None, scheduler, None, None, extra)


def _read(data: bytes, limit: int = MAX_TRAINING_STATE_BYTES) -> Any:
    return parse_training_state(data, limit).extra


def _int_keyed(depth: int) -> dict:
    value: Any = "leaf"
    for i in range(depth):
        value = {i: value}
    return value


# --------------------------------------------------------------------------- depth


def test_thirty_two_nested_int_keyed_dicts_are_read_back() -> None:
    """The issue's case: the writer counted a ``$dict`` as one level, the reader as two."""
    extra = _int_keyed(32)
    assert same_value(_read(_document(extra)), extra)


@pytest.mark.parametrize(
    "kind",
    [
        list,
        tuple,
        lambda v: {"k": v},
        lambda v: {7: v},
        lambda v: collections.OrderedDict([(2.5, v)]),
        lambda v: collections.Counter({"c": v}),
        lambda v: collections.deque([v], 4),
        lambda v: collections.defaultdict(list, {0: v}),
    ],
    ids=["list", "tuple", "dict", "int-dict", "ordereddict", "counter", "deque", "defaultdict"],
)
def test_depth_is_counted_alike_on_both_sides(kind, monkeypatch: pytest.MonkeyPatch) -> None:
    at_bound: Any = 1.5
    for _ in range(DEPTH):
        at_bound = kind([at_bound]) if kind in (list, tuple) else kind(at_bound)
    assert value_depth(at_bound) == DEPTH
    assert same_value(_read(_document(at_bound)), at_bound)

    past = kind([at_bound]) if kind in (list, tuple) else kind(at_bound)
    with pytest.raises(CheckpointError, match=rf"nested more than {DEPTH}") as caught:
        _document(past)
    assert type(caught.value) is CheckpointError and caught.value.field.startswith("extra")

    # The reader refuses the same value where a writer with a looser bound wrote it.
    monkeypatch.setattr(layout, "LIMITS", dataclasses.replace(LIMITS, value_depth=DEPTH + 1))
    forged = _document(past)
    monkeypatch.setattr(layout, "LIMITS", LIMITS)
    with pytest.raises(MalformedError, match="nested"):
        _read(forged)


def test_the_worst_json_nesting_at_the_bound_is_written() -> None:
    """Three JSON levels per container (a ``$dict``'s pairs), under orjson's own limit."""
    value: Any = TensorScalar("float64", float("nan"))
    for _ in range(DEPTH):
        value = collections.defaultdict(None, {0: value})
    data = build_training_state(
        1,
        None,
        value,
        [{"lr": 1.0}],
        None,  # random states have fixed shapes, checked whole (tests/hostile/test_rng_states.py)
        value,
    )
    state = parse_training_state(data, MAX_TRAINING_STATE_BYTES)
    assert same_value(state.extra, value) and same_value(state.scheduler, value)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_generated_values_at_and_past_the_depth_bound(data: st.DataObject) -> None:
    depth = data.draw(st.integers(DEPTH - 2, DEPTH + 2))
    value = data.draw(nested_values(depth))
    _round_trip_or_refused(value)


# --------------------------------------------------------------------------- the property


def _round_trip_or_refused(value: Any) -> None:
    """Accepted exactly when the reader's bounds hold; then read back exactly."""
    if value_fits(value):
        assert same_value(_read(_document(value)), value)
        assert same_value(parse_training_state(_document(None, value), 1 << 30).scheduler, value)
    else:
        with pytest.raises(CheckpointError) as caught:
            _document(value)
        assert type(caught.value) is CheckpointError
        assert caught.value.field.startswith("extra"), caught.value.field


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(training_values(beyond=True))
def test_what_the_writer_accepts_the_reader_reads_back_exactly(value: Any) -> None:
    _round_trip_or_refused(value)


# --------------------------------------------------------------------------- sizes and digits


def test_the_document_size_bound_is_the_writers_too(monkeypatch: pytest.MonkeyPatch) -> None:
    limit = 4096
    monkeypatch.setattr(layout, "LIMITS", dataclasses.replace(LIMITS, training_state_bytes=limit))
    overhead = len(_document(""))
    fits = _document("x" * (limit - overhead))
    assert len(fits) == limit and _read(fits, limit) == "x" * (limit - overhead)
    with pytest.raises(CheckpointError, match="more than the 4,096") as caught:
        _document("x" * (limit - overhead + 1))
    assert caught.value.field == "training state"
    # ... which is the reader's bound: one byte more, and the reader refuses it.
    with pytest.raises(FileTooLargeError):
        _read(fits + b" ", limit)


def test_the_writer_and_the_readers_share_one_table() -> None:
    assert LIMITS.training_state_bytes == layout.MAX_TRAINING_STATE_BYTES
    assert LIMITS.manifest_bytes == layout.MAX_MANIFEST_BYTES
    assert LIMITS.value_depth == layout.MAX_VALUE_DEPTH
    assert LIMITS.int_digits == layout.MAX_INT_DIGITS
    assert LIMITS.name_bytes == layout.MAX_NAME_BYTES


def test_integers_up_to_the_digit_bound_whatever_the_process_allows() -> None:
    top = 10**LIMITS.int_digits - 1
    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(640)  # a process that lowered Python's own bound
    try:
        for n in (top, -top, 2**64, -(2**63) - 1, 10**18 * 7 + 5):
            assert _read(_document([n])) == [n]
        with pytest.raises(CheckpointError, match=r"extra\[0\] is an integer of more than 4300"):
            _document([top + 1])
    finally:
        sys.set_int_max_str_digits(old)


# --------------------------------------------------------------------------- what JSON refuses


class _Thing:
    pass


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"note": "\ud800"}, "extra.note"),
        ({"a": ["ok", "x\udfff"]}, "extra.a[1]"),
        ({"\udc00": 1}, "extra.<key 0>"),
        ({(1, "\ud800"): 1}, "extra.<key 0>[1]"),
        ({"v": np.float32(1.0)}, "extra.v"),
        ({"v": np.int64(1)}, "extra.v"),
        ({"v": torch.ones(2)}, "extra.v"),
        ({"v": torch.tensor(1.0)}, "extra.v"),
        ({"v": b"bytes"}, "extra.v"),
        ({"v": bytearray(b"x")}, "extra.v"),
        ({"v": _Thing()}, "extra.v"),
        ({"v": 1 + 2j}, "extra.v"),
        ({_Thing(): 1}, "extra.<key 0>"),
        ({"v": {3: {frozenset({_Thing()}): 1}}}, "extra.v[3].<key 0>[0]"),
        ({"v": collections.defaultdict(lambda: 0)}, "extra.v"),
        ({"v": collections.defaultdict(np.float64)}, "extra.v"),
        ({"v": type("MyDict", (dict,), {})()}, "extra.v"),
        ({"v": type("MyCounter", (collections.Counter,), {})()}, "extra.v"),
        ({"v": TensorScalar("float32", "0.5")}, "extra.v"),
        ({"v": TensorScalar("Float!", 0.5)}, "extra.v"),
        ({"v": range(3)}, "extra.v"),
    ],
)
def test_values_json_refuses_are_checkpoint_errors_naming_the_path(extra, field) -> None:
    with pytest.raises(CheckpointError) as caught:
        _document(extra)
    assert type(caught.value) is CheckpointError and caught.value.field == field
    assert field in str(caught.value)


def test_a_lone_surrogate_message_stays_ascii() -> None:
    with pytest.raises(CheckpointError, match=r"lone surrogate \('\\ud800'") as caught:
        _document({"note": "abc\ud800"})
    str(caught.value).encode("utf-8")  # printable anywhere


# --------------------------------------------------------------------------- collections


def test_collections_containers_keep_their_types_order_and_parameters() -> None:
    extra = {
        "milestones": collections.Counter({30: 1, 10: 2, 20: 1}),
        "ordered": collections.OrderedDict([("b", 1), ("a", [2])]),
        "window": collections.deque([1.0, 2.0], maxlen=5),
        "unbounded": collections.deque([(1,)]),
        "groups": collections.defaultdict(list, {"x": [1], 2: []}),
        "plain": collections.defaultdict(None, {"y": 1}),
        "seen": {1, "a", (2, 3)},
        "frozen": frozenset({0.5}),
        "empty": [set(), frozenset(), collections.Counter(), collections.deque(maxlen=0)],
    }
    got = _read(_document(extra))
    assert same_value(got, extra)
    assert list(got["milestones"]) == [30, 10, 20] and got["window"].maxlen == 5
    assert got["groups"].default_factory is list and got["groups"]["new"] == []
    assert got["milestones"][99] == 0  # a Counter, not a dict


def test_tags_are_written_as_documented() -> None:
    assert encode_value(collections.Counter({2: 1}), ()) == {"$counter": [[2, 1]]}
    assert encode_value(collections.OrderedDict(a=1), ()) == {"$ordereddict": [["a", 1]]}
    assert encode_value(collections.deque([1], 3), ()) == {"$deque": [3, 1]}
    assert encode_value(collections.defaultdict(int, {"a": 1}), ()) == {
        "$defaultdict": ["int", ["a", 1]]
    }
    assert encode_value({3}, ()) == {"$set": [3]}
    assert encode_value(frozenset(), ()) == {"$frozenset": []}


@pytest.mark.parametrize(
    "document",
    [
        {"$deque": []},  # no maxlen
        {"$deque": [-1]},
        {"$deque": [1, 1, 2]},  # more items than maxlen: a deque would drop one
        {"$deque": [True, 1]},
        {"$deque": [2**64 - 1]},
        {"$deque": 3},
        {"$defaultdict": []},
        {"$defaultdict": ["os.system"]},
        {"$defaultdict": ["list", [1]]},
        {"$defaultdict": [3]},
        {"$counter": [[[1], 1]]},
        {"$counter": [[1, 1], [1, 2]]},
        {"$ordereddict": {"a": 1}},
        {"$set": [[1]]},
        {"$set": [1, 1]},
        {"$frozenset": [{"a": 1}]},
        {"$set": 1},
        {"$int": "00000000000000000000000001"},
        {"$int": "-0"},
        {"$int": "1" * 4301},
    ],
)
def test_malformed_collections_tags_are_refused(document) -> None:
    with pytest.raises(MalformedError):
        decode_value(document, ("extra",))


def test_hostile_nesting_is_refused_before_recursion_runs_deep() -> None:
    deep = "[" * 1000 + "]" * 1000
    data = _document(None).replace(b'"extra":null', b'"extra":' + deep.encode())
    with pytest.raises(MalformedError, match="nested"):
        _read(data)


# --------------------------------------------------------------------------- the manifest


def _members() -> dict[str, MemberRecord]:
    return {
        "model": MemberRecord("model.tlsf32", "float32_state", 1, 1, "0" * 32),
        "training_state": MemberRecord("training_state.json", "training_state", 1, 1, "1" * 32),
    }


@pytest.mark.parametrize(
    ("state", "field"),
    [
        ([("w" * (LIMITS.name_bytes + 1), (1,))], "state[0].name"),
        ([("ok", (1,)), ("\ud800", (1,))], "state[1].name"),
        ([("w", (1,) * (LIMITS.rank + 1))], "state[0].shape"),
    ],
)
def test_the_manifest_writer_refuses_what_its_reader_would(state, field) -> None:
    with pytest.raises(CheckpointError) as caught:
        build_manifest(1, "tlckpt test", _members(), state, 1)
    assert caught.value.field == field


def test_manifest_values_at_the_bounds_are_read() -> None:
    name = "é" * (LIMITS.name_bytes // 2)
    data = build_manifest(
        1, "t" * LIMITS.library_bytes, _members(), [(name, (2,) * LIMITS.rank)], 1
    )
    manifest = parse_manifest(data, LIMITS.manifest_bytes)
    assert manifest.state == ((name, (2,) * LIMITS.rank),)
    with pytest.raises(CheckpointError, match="library"):
        build_manifest(1, "t" * (LIMITS.library_bytes + 1), _members(), [], 1)
    with pytest.raises(CheckpointError, match="world_size"):
        build_manifest(1, "t", _members(), [], LIMITS.world_size + 1)


def test_encoded_values_are_json_that_orjson_writes() -> None:
    value = {"a": collections.Counter({(1, 2): 3}), 4: [collections.deque([set()])]}
    assert orjson.loads(orjson.dumps(encode_value(value, ("extra",))))

"""The codec's public values and caller-input checks (API.md, FORMAT.md §2-3).

* ``ParameterSchema``'s derived notions on FORMAT.md's examples and on ill-formed maps;
* ``AdamConfig.validate`` edge cases and bit-exact ``same_bits``;
* every caller-input error on write raises a :class:`CheckpointError` subclass and leaves
  no file (and an existing file untouched).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tlckpt.codec import (
    AdamConfig,
    AdamEntry,
    AdamKind,
    CheckpointError,
    ConfigError,
    EntryError,
    MomentDtype,
    ParameterSchema,
    SchemaMismatchError,
    read_adam,
    read_float32_state,
    write_adam,
    write_float32_state,
)

F32, F64 = MomentDtype.FLOAT32, MomentDtype.FLOAT64
ADAM, ADAMW = AdamKind.ADAM, AdamKind.ADAMW


def _next_up(x: float) -> float:
    return struct.unpack("<d", struct.pack("<Q", struct.unpack("<Q", struct.pack("<d", x))[0] + 1))[
        0
    ]


# ----------------------------------------------------------------------- ParameterSchema


def test_tied_example_of_format_md() -> None:
    """Slots ``[p, p, q]`` → representatives ``[0, 0, 2]``; entries for slots 0 and 2."""
    s = ParameterSchema([(2, 3), (2, 3), (4,)], [True, True, True], [0, 0, 2])
    assert s.is_well_formed()
    assert [s.representative(i) for i in range(3)] == [0, 0, 2]
    assert [s.is_representative(i) for i in range(3)] == [True, False, True]
    assert s.optimizer_state_count == 2
    assert s.has_aliases
    assert s.representative_slots == (0, 2)
    assert s.representative_tags() == [1, 1, 3]


def test_schema_without_map() -> None:
    s = ParameterSchema([(2,), (), (0, 3)], [True, False, True])
    assert s.is_well_formed()
    assert [s.representative(i) for i in range(3)] == [0, None, 2]
    assert s.representative(3) is None and s.representative(-1) is None  # out of range
    assert not s.is_representative(1)
    assert s.optimizer_state_count == 2
    assert not s.has_aliases
    assert [s.element_count(i) for i in range(3)] == [2, 1, 0]  # scalar 1, zero dim 0
    assert s.representative_tags() == [1, 0, 3]


def test_schema_with_map_but_no_aliases() -> None:
    s = ParameterSchema([(2,), (3,), (1,)], [True, False, True], [0, None, 2])
    assert s.is_well_formed()
    assert not s.has_aliases
    assert s.optimizer_state_count == 2
    assert s.representative(7) is None


def test_tag_maps_distinguish_pqp_from_pqq() -> None:
    """FORMAT.md §2: comparing only entry counts would confuse these two."""
    pqp = ParameterSchema([(2,), (2,), (2,)], [True] * 3, [0, 1, 0])
    pqq = ParameterSchema([(2,), (2,), (2,)], [True] * 3, [0, 1, 1])
    assert pqp.is_well_formed() and pqq.is_well_formed()
    assert pqp.optimizer_state_count == pqq.optimizer_state_count == 2
    assert pqp.representative_tags() == [1, 2, 1]
    assert pqq.representative_tags() == [1, 2, 2]
    assert pqp != pqq


ILL_FORMED = {
    "lengths": ParameterSchema([(2,), (2,)], [True]),
    "map_length": ParameterSchema([(2,), (2,)], [True, True], [0]),
    "later_representative": ParameterSchema([(2,), (2,)], [True, True], [1, 1]),
    "frozen_with_representative": ParameterSchema([(2,), (2,)], [True, False], [0, 0]),
    "trainable_without": ParameterSchema([(2,), (2,)], [True, True], [0, None]),
    "frozen_representative": ParameterSchema([(2,), (2,)], [False, True], [None, 0]),
    "other_shape": ParameterSchema([(2,), (3,)], [True, True], [0, 0]),
    "chain": ParameterSchema([(2,)] * 3, [True] * 3, [0, 0, 1]),
    "negative": ParameterSchema([(2,), (2,)], [True, True], [0, -1]),
    "self_not_first": ParameterSchema([(2,), (2,)], [True, True], [1, 1]),
}


@pytest.mark.parametrize("name", sorted(ILL_FORMED))
def test_ill_formed_schemas(name: str) -> None:
    assert not ILL_FORMED[name].is_well_formed()


# --------------------------------------------------------------------------- AdamConfig


@pytest.mark.parametrize(
    ("config", "ok"),
    [
        (AdamConfig(ADAM, -0.0, -0.0, 1e-8, 0.0), True),
        (AdamConfig(ADAM, 0.0, math.nextafter(1.0, 0.0), 1e-8, 0.0), True),
        (AdamConfig(ADAM, 1.0, 0.999, 1e-8, 0.0), False),
        (AdamConfig(ADAM, 0.9, 1.0, 1e-8, 0.0), False),
        (AdamConfig(ADAM, -1e-300, 0.999, 1e-8, 0.0), False),
        (AdamConfig(ADAM, math.nan, 0.999, 1e-8, 0.0), False),
        (AdamConfig(ADAM, 0.9, math.nan, 1e-8, 0.0), False),
        (AdamConfig(ADAM, math.inf, 0.999, 1e-8, 0.0), False),
        (AdamConfig(ADAM, 0.9, 0.999, 1e-50, 0.0, F32), False),
        (AdamConfig(ADAM, 0.9, 0.999, 1e-50, 0.0, F64), True),
        (AdamConfig(ADAM, 0.9, 0.999, 5e-324, 0.0, F64), True),
        (AdamConfig(ADAM, 0.9, 0.999, 1e-45, 0.0, F32), True),  # a float32 subnormal
        (AdamConfig(ADAM, 0.9, 0.999, 1e39, 0.0, F32), False),  # overflows float32
        (AdamConfig(ADAM, 0.9, 0.999, 1e39, 0.0, F64), True),
        (AdamConfig(ADAM, 0.9, 0.999, 0.0, 0.0, F64), False),
        (AdamConfig(ADAM, 0.9, 0.999, -1e-8, 0.0, F64), False),
        (AdamConfig(ADAM, 0.9, 0.999, math.inf, 0.0, F64), False),
        (AdamConfig(ADAM, 0.9, 0.999, math.nan, 0.0, F64), False),
        (AdamConfig(ADAM, 0.9, 0.999, 1e-8, -0.0), True),
        (AdamConfig(ADAM, 0.9, 0.999, 1e-8, 5e-324), False),
        (AdamConfig(ADAM, 0.9, 0.999, 1e-8, math.nan), False),
        (AdamConfig(ADAMW, 0.9, 0.999, 1e-8, -0.0), True),
        (AdamConfig(ADAMW, 0.9, 0.999, 1e-8, 1e300), True),
        (AdamConfig(ADAMW, 0.9, 0.999, 1e-8, -5e-324), False),
        (AdamConfig(ADAMW, 0.9, 0.999, 1e-8, math.inf), False),
        (AdamConfig(ADAMW, 0.9, 0.999, 1e-8, math.nan), False),
    ],
    ids=repr,
)
def test_validate(config: AdamConfig, ok: bool) -> None:
    if ok:
        config.validate()
    else:
        with pytest.raises(ConfigError) as info:
            config.validate()
        assert info.value.field in ("beta1", "beta2", "epsilon", "weight_decay")


def test_validate_names_the_bad_field() -> None:
    with pytest.raises(ConfigError) as info:
        AdamConfig(ADAM, 0.9, math.nan, 1e-8, 0.0).validate()
    assert info.value.field == "beta2"
    with pytest.raises(ConfigError) as info:
        AdamConfig(ADAM, 0.9, 0.999, 1e-50, 0.0).validate()
    assert info.value.field == "epsilon"


def test_same_bits() -> None:
    base = AdamConfig(ADAMW, 0.9, 0.999, 1e-8, 0.01)
    assert base.same_bits(AdamConfig(ADAMW, 0.9, 0.999, 1e-8, 0.01))
    assert not base.same_bits(AdamConfig(ADAMW, _next_up(0.9), 0.999, 1e-8, 0.01))
    assert not base.same_bits(AdamConfig(ADAMW, 0.9, 0.999, _next_up(1e-8), 0.01))
    assert not base.same_bits(AdamConfig(ADAMW, 0.9, 0.999, 1e-8, 0.01, F64))
    assert not base.same_bits(AdamConfig(ADAM, 0.9, 0.999, 1e-8, 0.01))
    zero = AdamConfig(ADAM, 0.0, 0.999, 1e-8, 0.0)
    negzero = AdamConfig(ADAM, -0.0, 0.999, 1e-8, -0.0)
    assert zero.beta1 == negzero.beta1  # equal as numbers ...
    assert not zero.same_bits(negzero)  # ... but not bit for bit
    assert not AdamConfig(ADAM, 0.9, 0.999, 1e-8, 0.0).same_bits(
        AdamConfig(ADAM, 0.9, 0.999, 1e-8, -0.0)
    )
    nan_a = struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000001))[0]
    nan_b = struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000002))[0]
    a = AdamConfig(ADAM, nan_a, 0.999, 1e-8, 0.0)
    assert a.same_bits(AdamConfig(ADAM, nan_a, 0.999, 1e-8, 0.0))
    assert not a.same_bits(AdamConfig(ADAM, nan_b, 0.999, 1e-8, 0.0))


def test_config_keeps_bits_and_coerces_tags() -> None:
    c = AdamConfig(1, -0.0, 0.5, 1e-8, -0.0, "float64")
    assert c.kind is ADAMW and c.dtype is F64
    assert math.copysign(1.0, c.beta1) == -1.0
    assert math.copysign(1.0, c.weight_decay) == -1.0
    assert AdamConfig(ADAM, 0, 0, 1, 0).beta1 == 0.0  # ints are accepted as floats


@pytest.mark.parametrize(
    "make",
    [
        lambda: AdamConfig(ADAM, "0.9", 0.999, 1e-8, 0.0),
        lambda: AdamConfig(ADAM, True, 0.999, 1e-8, 0.0),
        lambda: AdamConfig(ADAM, 0.9, None, 1e-8, 0.0),
        lambda: AdamConfig(2, 0.9, 0.999, 1e-8, 0.0),
        lambda: AdamConfig(ADAM, 0.9, 0.999, 1e-8, 0.0, "float16"),
    ],
    ids=["str", "bool", "none", "kind 2", "float16"],
)
def test_bad_config_values_are_config_errors(make: Callable[[], AdamConfig]) -> None:
    with pytest.raises(ConfigError):
        make()


# ------------------------------------------------------------------- writing: caller input

SCHEMA = ParameterSchema([(2, 2), (2, 2), (3,), ()], [True, True, False, True], [0, 0, None, 3])
CONFIG = AdamConfig(ADAMW, 0.9, 0.999, 1e-8, 0.01)


def _entry(slot: int, dtype: Any = "<f4", step: Any = 3) -> AdamEntry:
    n = SCHEMA.element_count(slot)
    return AdamEntry(step, np.arange(n, dtype=dtype), np.ones(n, dtype=dtype))


def _entries(**changes: Any) -> dict[int, AdamEntry]:
    entries = {0: _entry(0), 3: _entry(3)}
    entries.update({int(k[1:]): v for k, v in changes.items()})
    return entries


def _fresh(n: int) -> tuple[np.ndarray, np.ndarray]:
    return np.zeros(n, "<f4"), np.zeros(n, "<f4")


BAD_WRITES: dict[str, tuple[Callable[[Path], Any], type[CheckpointError]]] = {
    # schema
    **{
        f"schema_{name}": (
            lambda p, s=schema: write_adam(
                p, s, CONFIG, {i: _entry(0) for i in range(len(s.shapes))}
            ),
            SchemaMismatchError,
        )
        for name, schema in ILL_FORMED.items()
    },
    "schema_not_a_schema": (lambda p: write_adam(p, [(2,)], CONFIG, {}), SchemaMismatchError),
    # config
    "config_beta1_one": (
        lambda p: write_adam(p, SCHEMA, AdamConfig(ADAMW, 1.0, 0.999, 1e-8, 0.0), _entries()),
        ConfigError,
    ),
    "config_nan": (
        lambda p: write_adam(p, SCHEMA, AdamConfig(ADAMW, 0.9, math.nan, 1e-8, 0.0), _entries()),
        ConfigError,
    ),
    "config_eps_f32_underflow": (
        lambda p: write_adam(p, SCHEMA, AdamConfig(ADAMW, 0.9, 0.999, 1e-50, 0.0), _entries()),
        ConfigError,
    ),
    "config_adam_wd": (
        lambda p: write_adam(p, SCHEMA, AdamConfig(ADAM, 0.9, 0.999, 1e-8, 0.1), _entries()),
        ConfigError,
    ),
    "config_adamw_negative_wd": (
        lambda p: write_adam(p, SCHEMA, AdamConfig(ADAMW, 0.9, 0.999, 1e-8, -0.1), _entries()),
        ConfigError,
    ),
    "config_missing": (lambda p: write_adam(p, SCHEMA, None, _entries()), ConfigError),
    # entries must cover exactly the representative slots
    "entries_missing": (lambda p: write_adam(p, SCHEMA, CONFIG, {0: _entry(0)}), EntryError),
    "entries_alias": (lambda p: write_adam(p, SCHEMA, CONFIG, _entries(s1=_entry(1))), EntryError),
    "entries_frozen": (
        lambda p: write_adam(p, SCHEMA, CONFIG, _entries(s2=_entry(2))),
        EntryError,
    ),
    "entries_out_of_range": (
        lambda p: write_adam(p, SCHEMA, CONFIG, _entries(s9=_entry(0))),
        EntryError,
    ),
    "entries_none": (lambda p: write_adam(p, SCHEMA, CONFIG, {}), EntryError),
    # steps
    **{
        f"step_{name}": (
            lambda p, step=step: write_adam(p, SCHEMA, CONFIG, _entries(s3=_entry(3, step=step))),
            EntryError,
        )
        for name, step in {
            "zero": 0,
            "negative": -1,
            "bool": True,
            "too_big": 2**64,
            "float": 2.0,
            "none": None,
        }.items()
    },
    # moments
    "moment_float64_for_float32": (
        lambda p: write_adam(p, SCHEMA, CONFIG, _entries(s3=_entry(3, dtype="<f8"))),
        EntryError,
    ),
    "moment_float32_for_float64": (
        lambda p: write_adam(p, SCHEMA, AdamConfig(ADAMW, 0.9, 0.999, 1e-8, 0.01, F64), _entries()),
        EntryError,
    ),
    "moment_big_endian": (
        lambda p: write_adam(p, SCHEMA, CONFIG, _entries(s3=_entry(3, dtype=">f4"))),
        EntryError,
    ),
    "moment_count": (
        lambda p: write_adam(p, SCHEMA, CONFIG, _entries(s0=AdamEntry(1, *_fresh(3)))),
        EntryError,
    ),
    "moment_list": (
        lambda p: write_adam(p, SCHEMA, CONFIG, _entries(s3=AdamEntry(1, [0.0], [0.0]))),
        EntryError,
    ),
    "moment_v_wrong": (
        lambda p: write_adam(
            p, SCHEMA, CONFIG, _entries(s3=AdamEntry(1, np.zeros(1, "<f4"), np.zeros(2, "<f4")))
        ),
        EntryError,
    ),
    # random counter
    **{
        f"counter_{name}": (
            lambda p, c=counter: write_adam(p, SCHEMA, CONFIG, _entries(), c),
            ConfigError,
        )
        for name, counter in {
            "too_big": 2**64,
            "negative": -1,
            "bool": True,
            "float": 3.0,
            "str": "3",
        }.items()
    },
    # version forced where it cannot hold the state
    "version_2_with_aliases": (
        lambda p: write_adam(p, SCHEMA, CONFIG, _entries(), version=2),
        CheckpointError,
    ),
    "version_4_without_counter": (
        lambda p: write_adam(p, SCHEMA, CONFIG, _entries(), version=4),
        CheckpointError,
    ),
    "version_unknown": (
        lambda p: write_adam(p, SCHEMA, CONFIG, _entries(), version=99),
        CheckpointError,
    ),
    # float32 model state
    "state_float64": (lambda p: write_float32_state(p, [np.zeros(2)]), CheckpointError),
    "state_big_endian": (lambda p: write_float32_state(p, [np.zeros(2, ">f4")]), CheckpointError),
    "state_int32": (lambda p: write_float32_state(p, [np.zeros(2, "<i4")]), CheckpointError),
    "state_list": (lambda p: write_float32_state(p, [[0.0, 1.0]]), CheckpointError),
    "state_scalar": (lambda p: write_float32_state(p, [np.float32(1.0)]), CheckpointError),
}


@pytest.mark.parametrize("name", sorted(BAD_WRITES))
@pytest.mark.parametrize("previous", [False, True], ids=["fresh", "overwrite"])
def test_bad_write_raises_and_leaves_no_file(name: str, previous: bool, tmp_path: Path) -> None:
    write, expected = BAD_WRITES[name]
    path = tmp_path / "out.bin"
    if previous:
        path.write_bytes(b"old")
    with pytest.raises(CheckpointError) as info:
        write(path)
    assert isinstance(info.value, expected), repr(info.value)
    names = sorted(p.name for p in tmp_path.iterdir())
    if previous:
        assert names == ["out.bin"] and path.read_bytes() == b"old"
    else:
        assert names == []


def test_edge_values_that_must_be_accepted(tmp_path: Path) -> None:
    path = tmp_path / "opt.tladam"
    entries = _entries(s3=_entry(3, step=2**64 - 1))
    entries[0] = AdamEntry(np.int64(5), entries[0].m, entries[0].v)
    assert write_adam(path, SCHEMA, CONFIG, entries, np.uint64(2**64 - 1)) == 4
    ckpt = read_adam(path, SCHEMA)
    assert ckpt.random_counter == 2**64 - 1 and type(ckpt.random_counter) is int
    assert ckpt.entries[3].step == 2**64 - 1 and ckpt.entries[0].step == 5
    assert write_adam(path, SCHEMA, CONFIG, entries, 0) == 4
    assert read_adam(path, SCHEMA).random_counter == 0


def test_non_contiguous_arrays_are_written_in_order(tmp_path: Path) -> None:
    wide = np.arange(8, dtype="<f4")
    entries = {0: AdamEntry(1, wide[::2], wide[1::2]), 3: _entry(3)}
    path = tmp_path / "opt.tladam"
    write_adam(path, SCHEMA, CONFIG, entries)
    back = read_adam(path, SCHEMA).entries[0]
    assert back.m.tolist() == [0, 2, 4, 6] and back.v.tolist() == [1, 3, 5, 7]

    grid = np.arange(6, dtype="<f4").reshape(2, 3)
    state = tmp_path / "model.tlsf32"
    write_float32_state(state, [grid.T, np.asfortranarray(grid)])
    a, b = read_float32_state(state, [(3, 2), (2, 3)])
    assert a.tolist() == grid.T.tolist() and b.tolist() == grid.tolist()


def test_float32_state_needs_a_count_for_iterators(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        write_float32_state(tmp_path / "x", (a for a in [np.zeros(1, "<f4")]))
    assert list(tmp_path.iterdir()) == []

"""``adopt_config`` (a set restore's read of its optimizer member, issue #20 item 7): the
file's betas, epsilon and weight decay are taken, not compared; what the optimizer is (kind,
amsgrad, maximize, the moment dtype) and every other rule are still checked."""

from __future__ import annotations

import dataclasses
import io

import numpy as np
import pytest

from tlckpt.codec import (
    AdamEntry,
    AdamKind,
    ConfigError,
    MomentDtype,
    ParameterSchema,
    read_adam,
    read_optimizer_state,
    write_adam,
)
from tlckpt.codec.optimizers.adam import validate_adam
from tlckpt.codec.optimizers.tlckpt_optimizer_writer import write_optimizer_state
from tlckpt.codec.values.optimizer_types import OptimizerEntry, ParamGroupConfig
from tlckpt.testing.adam import adamw_config

SCHEMA = ParameterSchema([(2, 2), (3,)], [True, True], [0, 1])
#: The live optimizer's settings: none of the file's floats.
LIVE = dataclasses.replace(adamw_config(), beta1=0.8, beta2=0.95, epsilon=1e-6, weight_decay=0.0)


def _tladamf() -> bytes:
    entries = {
        s: AdamEntry(
            3, np.full(SCHEMA.element_count(s), 0.5, "<f4"), np.ones(SCHEMA.element_count(s), "<f4")
        )
        for s in (0, 1)
    }
    buffer = io.BytesIO()
    write_adam(buffer, SCHEMA, adamw_config(), entries, None)
    return buffer.getvalue()


def test_tladamf_floats_are_adopted_and_the_kind_and_dtype_still_checked() -> None:
    data = _tladamf()
    with pytest.raises(ConfigError, match="beta1"):
        read_adam(io.BytesIO(data), SCHEMA, expected_config=LIVE)
    ckpt = read_adam(io.BytesIO(data), SCHEMA, expected_config=LIVE, adopt_config=True)
    assert ckpt.config.same_bits(adamw_config())  # the file's, to install
    checked, _, _ = validate_adam(io.BytesIO(data), SCHEMA, expected_config=LIVE, adopt_config=True)
    assert checked.config.same_bits(adamw_config())
    adam = dataclasses.replace(LIVE, kind=AdamKind.ADAM)
    with pytest.raises(ConfigError, match="kind"):
        read_adam(io.BytesIO(data), SCHEMA, expected_config=adam, adopt_config=True)
    float64 = dataclasses.replace(LIVE, dtype=MomentDtype.FLOAT64)
    with pytest.raises(ConfigError, match="float32 in the file"):
        read_adam(
            io.BytesIO(data),
            SCHEMA,
            dtype=MomentDtype.FLOAT64,
            expected_config=float64,
            adopt_config=True,
        )


FILE_GROUP = ParamGroupConfig(AdamKind.ADAMW, 0.9, 0.999, 1e-8, 0.01, 1e-3, amsgrad=True)


def _tlckopt() -> bytes:
    entries = {
        s: OptimizerEntry(
            3, "float32", *(np.full(SCHEMA.element_count(s), x, "<f4") for x in (1.0, 2.0, 3.0))
        )
        for s in (0, 1)
    }
    buffer = io.BytesIO()
    write_optimizer_state(buffer, SCHEMA, [FILE_GROUP], [0, 0], entries, None)
    return buffer.getvalue()


def _read(live: ParamGroupConfig, adopt: bool):
    return read_optimizer_state(
        io.BytesIO(_tlckopt()), SCHEMA, groups=[live], slot_groups=[0, 0], adopt_config=adopt
    )


def test_tlckopt_floats_are_adopted_and_kind_amsgrad_maximize_still_checked() -> None:
    live = dataclasses.replace(FILE_GROUP, beta1=0.8, beta2=0.95, epsilon=1e-6, weight_decay=0.0)
    with pytest.raises(ConfigError, match="beta1"):
        _read(live, adopt=False)
    assert _read(live, adopt=True).groups == (FILE_GROUP,)  # the file's, to install
    for name, value in (("kind", AdamKind.ADAM), ("amsgrad", False), ("maximize", True)):
        with pytest.raises(ConfigError, match=name):
            _read(dataclasses.replace(live, **{name: value}), adopt=True)

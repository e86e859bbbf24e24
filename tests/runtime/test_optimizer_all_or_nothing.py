"""A bad optimizer file changes nothing: every invalid vector, and every truncation and many
byte flips of real saved files, raise a CheckpointError with the optimizer (``step`` tensors
included) and the model bit for bit as they were; a mutant that is still a valid file loads
exactly what the codec reads from it."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
from runtime_support import header_config, hex_bits, optimizer_for, step_once, tensors_from_schema

from tlckpt.codec import CheckpointError, MomentDtype, read_adam
from tlckpt.codec.errors import ERROR_OF_CATEGORY
from tlckpt.runtime import load_optimizer, save_optimizer, schema_of
from tlckpt.testing.bitwise import (
    module_unchanged,
    optimizer_unchanged,
    snapshot_module,
    snapshot_optimizer,
)
from tlckpt.testing.models import TiedNet, make_adam, train


def _destination_config(vector: dict, data: bytes) -> dict | None:
    expected = vector.get("expected_config")
    if expected is not None:
        return {
            "kind": expected["kind"],
            "betas": (hex_bits(expected, "beta1"), hex_bits(expected, "beta2")),
            "eps": hex_bits(expected, "epsilon"),
            "wd": hex_bits(expected, "weight_decay"),
        }
    if vector["category"] in ("config", "counter", "dtype"):
        return None  # a valid default: the file's own config (or tag) is what must fail
    return header_config(data)  # the file's config, so its later defect is found


@pytest.mark.vectors("invalid", kind="adam")
def test_invalid_vectors_change_nothing(vector: dict, vectors_dir: Path):
    path = vectors_dir / vector["file"]
    dtype = torch.float32 if vector["dtype"] == "float32" else torch.float64
    tensors = tensors_from_schema(vector["schema"], dtype)
    opt = optimizer_for(_destination_config(vector, path.read_bytes()), tensors)
    step_once(opt, tensors)  # live state that a partial load would damage
    snap, params = snapshot_optimizer(opt), snapshot_module(tensors)
    with pytest.raises(ERROR_OF_CATEGORY[vector["category"]]):
        load_optimizer(opt, tensors, path, restore_random_counter=True)
    assert optimizer_unchanged(opt, snap)
    assert module_unchanged(tensors, params)


def _mutants(data: bytes) -> list[bytes]:
    out = [data[:n] for n in range(len(data))]
    out += [
        data[:i] + bytes([data[i] ^ mask]) + data[i + 1 :]
        for i in range(len(data))
        for mask in (0x01, 0x40, 0x80)
    ]
    out += [data + b"\0", data + data[-8:]]
    return out


@pytest.mark.parametrize(
    "dtype, tied, counter, impl",
    [
        (torch.float32, True, None, "default"),  # v3
        (torch.float32, True, 5, "fused"),  # v4
        (torch.float32, False, None, "foreach_true"),  # v2
        (torch.float64, True, 9, "default"),  # v5
    ],
    ids=["v3", "v4-fused", "v2-foreach", "v5"],
)
def test_mutated_files(dtype, tied, counter, impl, record_property):
    torch.manual_seed(0)
    model = TiedNet(dtype, tied=tied)
    opt = make_adam("adamw", model.parameters(), impl)
    train(model, opt, 0, 2)
    stream = io.BytesIO()
    save_optimizer(opt, model, stream, random_counter=counter)
    original = stream.getvalue()
    train(model, opt, 2, 1)  # live state differs from the file's
    snap, params = snapshot_optimizer(opt), snapshot_module(model)
    schema = schema_of(model)
    moment = MomentDtype.FLOAT32 if dtype == torch.float32 else MomentDtype.FLOAT64
    slots = [p for _, p in model.named_parameters(remove_duplicate=False)]
    mutants = _mutants(original)
    rejected = 0
    for mutant in mutants:
        try:
            load_optimizer(
                opt, model, io.BytesIO(mutant), restore_random_counter=counter is not None
            )
        except CheckpointError:
            rejected += 1
            assert optimizer_unchanged(opt, snap), "changed by a rejected file"
            continue
        ckpt = read_adam(io.BytesIO(mutant), schema, dtype=moment)
        for slot, entry in ckpt.entries.items():
            state = opt.state[slots[slot]]
            assert state["step"].item() == entry.step
            assert state["exp_avg"].reshape(-1).numpy().tobytes() == entry.m.tobytes()
            assert state["exp_avg_sq"].reshape(-1).numpy().tobytes() == entry.v.tobytes()
        # Put the live state back for the next mutant.
        opt.state.clear()
        opt.state.update(
            {
                p: {k: v.clone() for k, v in s.items()}
                for p, s in zip([p for g in opt.param_groups for p in g["params"]], snap["state"])
                if s is not None
            }
        )
        assert optimizer_unchanged(opt, snap)
    assert module_unchanged(model, params)
    assert rejected >= len(original) + 2
    record_property("mutants", len(mutants))
    record_property("rejected", rejected)

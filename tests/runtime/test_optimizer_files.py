"""Optimizer files and the codec agree: what the runtime writes the codec reads back as the
optimizer's tensors, and every conformance vector loads into a live optimizer (in the step
form of its settings) and saves back to the very same bytes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from runtime_support import hex_bits, tensors_from_schema

from tlckpt.codec import AdamKind, MomentDtype, read_adam
from tlckpt.codec import inspect as tlckpt_inspect
from tlckpt.runtime import load_optimizer, save_optimizer, schema_of
from tlckpt.testing.models import TiedNet, make_adam, train


def _assert_file_matches_optimizer(path: Path, opt, model, dtype: torch.dtype) -> None:
    moment = MomentDtype.FLOAT32 if dtype == torch.float32 else MomentDtype.FLOAT64
    schema = schema_of(model)
    ckpt = read_adam(path, schema, dtype=moment)
    group = opt.param_groups[0]
    assert ckpt.config.kind is (
        AdamKind.ADAMW if isinstance(opt, torch.optim.AdamW) else AdamKind.ADAM
    )
    assert (ckpt.config.beta1, ckpt.config.beta2) == group["betas"]
    assert ckpt.config.epsilon == group["eps"]
    assert ckpt.config.weight_decay == group["weight_decay"]
    tensors = [p for _, p in model.named_parameters(remove_duplicate=False)]
    assert sorted(ckpt.entries) == list(schema.representative_slots)
    for slot, entry in ckpt.entries.items():
        state = opt.state[tensors[slot]]
        assert entry.step == state["step"].item()
        for array, key in ((entry.m, "exp_avg"), (entry.v, "exp_avg_sq")):
            live = state[key].reshape(-1).numpy()
            assert array.dtype == live.dtype
            assert array.tobytes() == live.tobytes(), (slot, key)


@pytest.mark.parametrize(
    "dtype, tied, counter, version",
    [
        (torch.float32, False, None, 2),
        (torch.float32, True, None, 3),
        (torch.float32, True, 77, 4),
        (torch.float32, False, 0, 4),
        (torch.float64, True, None, 5),
        (torch.float64, False, 2**64 - 1, 5),
    ],
)
@pytest.mark.parametrize("kind", ["adam", "adamw"])
def test_codec_reads_runtime_files(tmp_path, kind, dtype, tied, counter, version):
    torch.manual_seed(0)
    model = TiedNet(dtype, tied=tied)
    opt = make_adam(kind, model.parameters(), "fused" if tied else "default")
    train(model, opt, 0, 3)
    path = tmp_path / "o.tladam"
    assert save_optimizer(opt, model, path, random_counter=counter) == version
    _assert_file_matches_optimizer(path, opt, model, dtype)
    moment = MomentDtype.FLOAT32 if dtype == torch.float32 else MomentDtype.FLOAT64
    assert read_adam(path, schema_of(model), dtype=moment).random_counter == counter


def _vector_optimizer(vector: dict, impl: str):
    config = vector["config"]
    dtype = torch.float32 if config["dtype"] == "float32" else torch.float64
    tensors = tensors_from_schema(vector["schema"], dtype)
    unique = list({id(t): t for t in tensors}.values())
    cls = torch.optim.Adam if config["kind"] == "adam" else torch.optim.AdamW
    options = {"foreach": {"foreach": True}, "fused": {"fused": True}}.get(impl, {})
    opt = cls(
        unique,
        lr=0.01,
        betas=(hex_bits(config, "beta1"), hex_bits(config, "beta2")),
        eps=hex_bits(config, "epsilon"),
        weight_decay=hex_bits(config, "weight_decay"),
        **options,
    )
    return tensors, opt, dtype


@pytest.mark.parametrize("impl", ["default", "foreach", "fused"])
@pytest.mark.vectors("adam")
def test_valid_vectors_load_and_save_back_identically(vector, vectors_dir, tmp_path, impl):
    if not vector["schema"]["shapes"]:
        pytest.skip("torch cannot build an optimizer over no parameters")
    tensors, opt, dtype = _vector_optimizer(vector, impl)
    counter = vector["random_counter"]
    source = vectors_dir / vector["file"]
    got = load_optimizer(opt, tensors, source, restore_random_counter=counter is not None)
    assert got == counter
    np_dtype = np.float32 if dtype == torch.float32 else np.float64
    assert len(opt.state) == len(vector["entries"])
    for entry in vector["entries"]:
        p = tensors[entry["id"]]
        state = opt.state[p]
        assert list(state) == ["step", "exp_avg", "exp_avg_sq"]
        step = state["step"]
        assert step.item() == entry["step"]
        assert step.dtype == torch.float32 and step.shape == ()
        assert step.device == (p.device if impl == "fused" else torch.device("cpu"))
        for key, field in (("exp_avg", "m"), ("exp_avg_sq", "v")):
            assert state[key].shape == p.shape and state[key].dtype == p.dtype
            assert state[key].numpy().astype(np_dtype).tobytes() == bytes.fromhex(entry[field])
    out = tmp_path / "again.tladam"
    assert save_optimizer(opt, tensors, out, random_counter=counter) == vector["version"]
    assert out.read_bytes() == source.read_bytes()


def test_channels_last_parameter_keeps_its_layout(tmp_path):
    """Adam keeps moments in the parameter's memory format; so does the load."""
    conv = torch.nn.Conv2d(3, 4, 3).to(memory_format=torch.channels_last)
    opt = torch.optim.Adam(conv.parameters(), lr=0.01)
    conv(torch.randn(2, 3, 5, 5).to(memory_format=torch.channels_last)).sum().backward()
    opt.step()
    save_optimizer(opt, conv, tmp_path / "c")
    fresh = torch.optim.Adam(conv.parameters(), lr=0.01)
    load_optimizer(fresh, conv, tmp_path / "c")
    for p in conv.parameters():
        for key in ("exp_avg", "exp_avg_sq"):
            assert fresh.state[p][key].stride() == opt.state[p][key].stride()
            assert torch.equal(fresh.state[p][key], opt.state[p][key])


def test_state_of_frozen_parameters_is_dropped_on_load(tmp_path):
    torch.manual_seed(0)
    model = TiedNet()
    opt = make_adam("adamw", model.parameters())
    train(model, opt, 0, 1)
    save_optimizer(opt, model, tmp_path / "o")
    opt.state[model.frozen.weight] = {"junk": torch.zeros(1)}
    load_optimizer(opt, model, tmp_path / "o")
    assert model.frozen.weight not in opt.state
    assert len(opt.state) == schema_of(model).optimizer_state_count


def test_file_objects(tmp_path):
    import io

    torch.manual_seed(0)
    model = TiedNet()
    opt = make_adam("adam", model.parameters())
    train(model, opt, 0, 2)
    stream = io.BytesIO(b"xyz")
    stream.seek(3)
    assert save_optimizer(opt, model, stream) == 3
    stream.seek(3)
    fresh = make_adam("adam", model.parameters())
    load_optimizer(fresh, model, stream)
    assert stream.tell() == len(stream.getvalue())
    for p in opt.state:
        assert torch.equal(opt.state[p]["exp_avg_sq"], fresh.state[p]["exp_avg_sq"])


@pytest.mark.vectors("adam")
def test_groups_differing_only_in_lr_still_give_torchleans_bytes(vector, vectors_dir, tmp_path):
    """The writer keeps TorchLean's version whenever the state fits it: two param groups
    that differ only in the learning rate (which TorchLean's files do not hold) save back to
    the vector's very bytes, even with ``require_torchlean=True``."""
    if len(vector["schema"]["shapes"]) < 2:
        pytest.skip("fewer than two parameters: no second group")
    tensors, one_group, _ = _vector_optimizer(vector, "default")
    unique = list({id(t): t for t in tensors}.values())
    defaults = {k: v for k, v in one_group.param_groups[0].items() if k != "params"}
    groups = [
        {**defaults, "params": unique[:1], "lr": 0.5},
        {**defaults, "params": unique[1:], "lr": 0.001},
    ]
    opt = type(one_group)(groups)
    counter = vector["random_counter"]
    source = vectors_dir / vector["file"]
    load_optimizer(opt, tensors, source, restore_random_counter=counter is not None)
    assert [g["lr"] for g in opt.param_groups] == [0.5, 0.001]  # the live ones stay
    out = tmp_path / "again.tladam"
    version = save_optimizer(opt, tensors, out, random_counter=counter, require_torchlean=True)
    assert version == vector["version"]
    assert out.read_bytes() == source.read_bytes()


@pytest.mark.parametrize("counter", [None, 7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_single_group_states_pick_torchleans_versions(tmp_path, tied, dtype, counter):
    """Single-group float32/float64 states are TorchLean's v2 to v5, as FORMAT.md selects:
    the new family is never written for them."""
    torch.manual_seed(0)
    model = TiedNet(dtype, tied=tied)
    opt = make_adam("adamw", model.parameters())
    train(model, opt, 0, 2)
    path = tmp_path / "o"
    version = save_optimizer(opt, model, path, random_counter=counter)
    want = 5 if dtype == torch.float64 else 4 if counter is not None else 3 if tied else 2
    assert version == want
    assert tlckpt_inspect(path)["family"] == "adam"

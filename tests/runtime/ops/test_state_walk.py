"""The one walk over a state (``StateWalk``) and the TLSF32B save and load built on it:
plain and other tensors told apart, ties found from the walk's addresses, and no answer
carried from one call to the next when the module changed between them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import tlckpt
from tlckpt.codec.errors import ConfigError
from tlckpt.runtime.ops.state_tensors import tied_copies
from tlckpt.runtime.ops.state_walk import StateWalk, float32_walk, is_plain


def _named(tensors: list[torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
    return [(f"t{i}", t) for i, t in enumerate(tensors)]


def test_every_tensor_plain_gives_no_mask_and_its_addresses() -> None:
    tensors = [torch.randn(4) for _ in range(5)]
    walk = StateWalk(_named(tensors))
    assert walk.plain_mask is None
    plain, addresses, others = walk.split()
    assert plain.tolist() == [0, 1, 2, 3, 4] and others == []
    assert addresses.tolist() == [t.data_ptr() for t in tensors]
    assert walk.tensors_at(plain) is walk.tensors
    assert walk.shapes == [(4,)] * 5


def test_the_mask_agrees_with_is_plain_for_each_kind_of_tensor() -> None:
    complex_values = torch.randn(3, dtype=torch.complex64)
    tensors = [
        torch.randn(3),
        torch.randn(3, 2).t(),  # strided
        torch.zeros(3, dtype=torch.int64),  # another dtype
        complex_values.conj().imag,  # a lazily negated float32 view
        torch.nn.Parameter(torch.randn(2)),
    ]
    walk = StateWalk(_named(tensors))
    assert walk.plain_mask is not None
    expected = [True, False, False, False, True]
    assert walk.plain_mask.tolist() == [is_plain(t) for t in tensors] == expected
    plain, addresses, others = walk.split([1, 2, 3, 4])
    assert plain.tolist() == [4] and others == [1, 2, 3]
    assert addresses.tolist() == [tensors[4].data_ptr()]
    assert walk.tensors_at(plain) == [tensors[4]]


def test_ties_from_the_walks_addresses_match_the_search_of_its_own() -> None:
    shared = torch.randn(6)
    tensors = [shared, torch.randn(6), shared, shared[:3], torch.zeros(0), torch.zeros(0)]
    walk = StateWalk(_named(tensors))
    assert tied_copies(walk.named, walk.addresses) == tied_copies(walk.named) == {2: 0}


def test_float32_walk_refuses_another_floating_dtype() -> None:
    model = torch.nn.Linear(2, 2).to(torch.float64)
    with pytest.raises(ConfigError, match="float32 state only"):
        float32_walk(model)
    mixed = float32_walk(torch.nn.BatchNorm1d(3))  # an int64 buffer travels as float32
    assert mixed.dtypes == {torch.float32, torch.int64}


@pytest.mark.parametrize("staged", [True, False])
def test_a_parameter_given_new_memory_between_calls_is_loaded_where_it_is_now(
    tmp_path: Path, staged: bool
) -> None:
    """``p.data = other`` keeps the parameter object and its version counter: a layout kept
    from an earlier call would write into the old memory."""
    model = torch.nn.Sequential(*[torch.nn.Linear(3, 3) for _ in range(4)])
    path = tmp_path / "m.tlsf32"
    tlckpt.save_module_state(model, path)
    saved = [t.detach().clone() for t in model.state_dict().values()]
    tlckpt.load_module_state(model, path, staged=staged)
    old = model[1].weight.data
    model[1].weight.data = torch.full((3, 3), 7.0)
    model[2].bias.data = torch.full((6,), 1.0)[::2]  # strided now: not plain
    old.zero_()
    tlckpt.load_module_state(model, path, staged=staged)
    for t, expected in zip(model.state_dict().values(), saved):
        assert torch.equal(t, expected)
    assert not old.any()  # the memory the parameter held before was left alone


def test_a_save_after_a_shape_change_writes_the_new_shapes(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 2)
    tlckpt.save_module_state(model, tmp_path / "a.tlsf32")
    model.weight.data = torch.randn(3, 4)  # same object, new shape
    tlckpt.save_module_state(model, tmp_path / "b.tlsf32")
    dest = [torch.zeros(3, 4), torch.zeros(2)]
    tlckpt.load_module_state(dest, tmp_path / "b.tlsf32")
    assert torch.equal(dest[0], model.weight.detach()) and torch.equal(dest[1], model.bias)

"""``schema_of``: slot order, frozen slots, tied weights by storage identity, overlaps."""

from __future__ import annotations

import pytest
import torch

from tlckpt.codec import ParameterSchema, SchemaMismatchError
from tlckpt.runtime import schema_of
from tlckpt.testing.models import TiedNet


def test_tied_model_schema():
    schema = schema_of(TiedNet())
    # emb.weight, norm.weight, norm.bias, frozen.weight, frozen.bias, mix.weight, mix.bias,
    # head.weight (= emb.weight), head.bias
    assert schema.requires_grad == (True, True, True, False, False, True, True, True, True)
    assert schema.representatives == (0, 1, 2, None, None, 5, 6, 0, 8)
    assert schema.has_aliases and schema.optimizer_state_count == 6
    assert schema.shapes[7] == schema.shapes[0] == (7, 4)
    assert schema.is_well_formed()


def test_untied_model_has_no_map():
    schema = schema_of(TiedNet(tied=False))
    assert schema.representatives is None
    assert not schema.has_aliases
    assert schema.optimizer_state_count == 7


def test_sequence_with_repeats_and_frozen():
    p = torch.nn.Parameter(torch.zeros(2, 3))
    q = torch.nn.Parameter(torch.zeros(4))
    frozen = torch.zeros(5)
    schema = schema_of([p, p, frozen, q, p])
    assert schema == ParameterSchema(
        [(2, 3), (2, 3), (5,), (4,), (2, 3)], [True, True, False, True, True], [0, 0, None, 3, 0]
    )


def test_distinct_parameters_on_one_storage_are_tied():
    base = torch.nn.Parameter(torch.randn(3, 3))
    twin = torch.nn.Parameter(base.data)  # another Parameter object, same storage and view
    assert schema_of([base, twin]).representatives == (0, 0)


def test_frozen_view_of_trainable_storage_is_frozen_not_alias():
    base = torch.nn.Parameter(torch.randn(3, 3))
    frozen_twin = torch.nn.Parameter(base.data, requires_grad=False)
    late = torch.nn.Parameter(base.data)
    assert schema_of([frozen_twin, base, late]).representatives == (None, 1, 1)


def test_partial_overlap_is_refused_naming_both():
    flat = torch.randn(10)
    whole = torch.nn.Parameter(flat)
    part = torch.nn.Parameter(flat[2:6])
    with pytest.raises(SchemaMismatchError, match=r"params\[0\].*params\[1\]"):
        schema_of([whole, part])


def test_same_storage_other_stride_is_an_overlap():
    base = torch.randn(4, 4)
    a = torch.nn.Parameter(base)
    b = torch.nn.Parameter(base.t())  # same bytes, transposed view: not the same parameter
    with pytest.raises(SchemaMismatchError):
        schema_of([a, b])


def test_disjoint_views_of_one_buffer_are_independent():
    flat = torch.randn(10)
    a = torch.nn.Parameter(flat[:4])
    b = torch.nn.Parameter(flat[4:])
    assert schema_of([a, b]).representatives is None


def test_zero_size_and_scalar_slots():
    empty_a = torch.nn.Parameter(torch.zeros(0, 3))
    empty_b = torch.nn.Parameter(torch.zeros(0, 3))
    scalar = torch.nn.Parameter(torch.tensor(1.0))
    schema = schema_of([empty_a, empty_b, scalar, empty_a])
    assert schema.representatives == (0, 1, 2, 0)
    assert schema.element_count(2) == 1 and schema.element_count(0) == 0


def test_named_parameters_keep_duplicates_in_module_order():
    model = TiedNet()
    names = [n for n, _ in model.named_parameters(remove_duplicate=False)]
    assert len(schema_of(model).shapes) == len(names) == 9


def test_mapping_input():
    p = torch.nn.Parameter(torch.zeros(2))
    assert schema_of({"a": p, "b": p}).representatives == (0, 0)


def test_single_tensor_is_rejected():
    with pytest.raises(TypeError):
        schema_of(torch.zeros(2))

"""The optimizer-tree document and family, torch-free: build/parse round trip, the sniff,
``inspect``, destinations, and hostile documents refused with typed errors."""

from __future__ import annotations

import contextlib
import io
from typing import Any

import numpy as np
import orjson
import pytest

from tlckpt.codec import (
    CheckpointError,
    MalformedError,
    SchemaMismatchError,
    UnsupportedFormatError,
    UnsupportedVersionError,
    inspect,
)
from tlckpt.codec.families import family_named
from tlckpt.codec.fileio.source import open_source
from tlckpt.codec.inspection import sniff_family
from tlckpt.codec.optimizers.optimizer_tree import (
    GroupRecord,
    build_document,
    is_placeholder,
    parse_document,
    placeholder,
)
from tlckpt.codec.safetensors import read_header, write_safetensors
from tlckpt.formats.optimizer_tree import DOCUMENT_KEY, FAMILY, HEAD

GROUPS = [
    GroupRecord((("w", "F32", (2, 3)), ("b", "BF16", (3,))), {"lr": 0.5, "betas": (0.9, 1e300)}),
    GroupRecord((("e", "F64", (4,)),), {"lr": float("-inf"), "nesterov": True, "fn": None}),
]
STATE = {
    "w": {"momentum_buffer": placeholder(0), "step": placeholder(1)},
    "e": {"old_dirs": [placeholder(2), None], "n_iter": 2**70, "t": float("nan")},
}
TENSORS = {
    "state/w/momentum_buffer": np.arange(6, dtype="<f4").reshape(2, 3),
    "state/w/step": np.asarray(3.0, dtype="<f4"),
    "state/e/old_dirs/0": np.asarray([-0.0, 1.0, 2.0, 3.0], dtype="<f8"),
}


def _file(metadata: dict[str, str] | None = None, tensors: dict[str, Any] | None = None) -> bytes:
    tensors = TENSORS if tensors is None else tensors
    if metadata is None:
        metadata = build_document(
            "torch.optim.sgd.SGD", list(TENSORS), GROUPS, STATE, random_counter=11
        )
    buffer = io.BytesIO()
    write_safetensors(buffer, tensors, metadata=metadata)
    return buffer.getvalue()


def _parse(data: bytes):
    with open_source(io.BytesIO(data)) as src:
        return parse_document(read_header(src))


def _edited(edit) -> bytes:
    metadata = build_document("torch.optim.sgd.SGD", list(TENSORS), GROUPS, STATE)
    document = orjson.loads(metadata[DOCUMENT_KEY])
    edit(document)
    return _file({DOCUMENT_KEY: orjson.dumps(document).decode()})


def test_document_round_trips_exactly() -> None:
    document = _parse(_file())
    assert document.optimizer_class == "torch.optim.sgd.SGD"
    assert document.random_counter == 11
    assert document.tensors == tuple(TENSORS)
    assert [g.params for g in document.groups] == [g.params for g in GROUPS]
    assert document.groups[0].options == {"lr": 0.5, "betas": (0.9, 1e300)}
    assert document.groups[1].options["lr"] == float("-inf")
    e = document.state["e"]
    assert is_placeholder(e["old_dirs"][0]) and e["old_dirs"][1] is None
    assert e["n_iter"] == 2**70 and e["t"] != e["t"]


def test_sniff_and_inspect_name_the_family() -> None:
    data = _file()
    assert data[8:].startswith(HEAD)
    assert sniff_family(io.BytesIO(data)) == FAMILY
    info = inspect(io.BytesIO(data))
    assert info["family"] == FAMILY and info["class"] == "torch.optim.sgd.SGD"
    assert info["groups"][0]["params"] == ["w", "b"]
    assert info["state"]["e"] == ["n_iter", "old_dirs", "t"]
    # A plain safetensors file is not an optimizer tree.
    assert sniff_family(io.BytesIO(_file({"format": "pt"}, {"x": np.zeros(2, "<f4")}))) == (
        "safetensors"
    )


def test_destination_checks_class_and_groups() -> None:
    family = family_named(FAMILY)
    data = _file()
    target = family.destination(io.BytesIO(data), 0)
    family.read(io.BytesIO(data), target, True, 0)
    renamed = [GroupRecord((("W", "F32", (2, 3)), GROUPS[0].params[1]), {}), GROUPS[1]]
    other = _file(build_document("torch.optim.sgd.SGD", [], renamed, {}), {})
    with pytest.raises(SchemaMismatchError, match="param group 0"):
        family.read(io.BytesIO(other), target, False, 0)
    other_class = _file(build_document("torch.optim.rmsprop.RMSprop", [], GROUPS, {}), {})
    with pytest.raises(SchemaMismatchError, match="RMSprop"):
        family.read(io.BytesIO(other_class), target, False, 0)
    described = family.parse_destination(
        {"class": "torch.optim.sgd.SGD", "groups": [{"params": [["w", "F32", [2, 3]]]}]}, "d"
    )
    with pytest.raises(SchemaMismatchError):
        family.read(io.BytesIO(data), described, False, 0)


def test_unholdable_values_are_refused_before_writing() -> None:
    with pytest.raises(CheckpointError, match="state"):
        build_document("c", [], [], {"w": {"fn": object()}})


def _nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


HOSTILE = {
    "not json": lambda d: None,
    "version": lambda d: d.update(version=2),
    "format": lambda d: d.update(format="other"),
    "class type": lambda d: d.update({"class": ["x"]}),
    "extra member": lambda d: d.update(extra=1),
    "missing member": lambda d: d.pop("state"),
    "counter negative": lambda d: d.update(random_counter=-3),
    "counter bool": lambda d: d.update(random_counter=True),
    "tensors not listed": lambda d: d["tensors"].pop(),
    "tensor listed twice": lambda d: d["tensors"].__setitem__(1, d["tensors"][0]),
    "params not triple": lambda d: d["groups"][0]["params"][0].pop(),
    "unknown dtype": lambda d: d["groups"][0]["params"][0].__setitem__(1, "F128"),
    "negative dim": lambda d: d["groups"][0]["params"][0].__setitem__(2, [-1]),
    "name twice": lambda d: d["groups"][1]["params"].append(["w", "F32", [2, 3]]),
    "options not object": lambda d: d["groups"][0].update(options=[1]),
    "options hold params": lambda d: d["groups"][0]["options"].update(params=[]),
    "state of nobody": lambda d: d["state"].update(ghost={}),
    "state not object": lambda d: d["state"].update(w=[1]),
    "placeholder twice": lambda d: d["state"]["w"].update(step={"$tensor": ["file_tensor", 0]}),
    "placeholder out of range": lambda d: d["state"]["w"].update(
        step={"$tensor": ["file_tensor", 9]}
    ),
    "placeholder not int": lambda d: d["state"]["w"].update(step={"$tensor": ["file_tensor", 1.5]}),
    "other tagged tensor": lambda d: d["state"]["w"].update(step={"$tensor": ["float32", 1.0]}),
    "placeholder as key": lambda d: d["state"]["w"].update(
        k={"$dict": [[{"$tensor": ["file_tensor", 1]}, 0]]}
    ),
    "unknown tag": lambda d: d["state"]["w"].update(k={"$what": 1}),
    "deep": lambda d: d["state"]["w"].update(k=_nested(200)),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_documents_are_refused(case: str) -> None:
    data = _file({DOCUMENT_KEY: "{not json"}) if case == "not json" else _edited(HOSTILE[case])
    with pytest.raises(
        (MalformedError, SchemaMismatchError, UnsupportedFormatError, UnsupportedVersionError)
    ):
        _parse(data)
    with pytest.raises(CheckpointError):
        inspect(io.BytesIO(data))


def test_version_and_format_errors_are_typed() -> None:
    with pytest.raises(UnsupportedVersionError):
        _parse(_edited(lambda d: d.update(version=2)))
    with pytest.raises(UnsupportedFormatError):
        _parse(_edited(lambda d: d.update(format="other")))


def test_duplicate_keys_are_refused() -> None:
    text = build_document("c", list(TENSORS), GROUPS, STATE)[DOCUMENT_KEY]
    doubled = text.replace('"class":"c"', '"class":"c","class":"d"')
    with pytest.raises(MalformedError, match="twice"):
        _parse(_file({DOCUMENT_KEY: doubled}))


def test_missing_document_is_refused() -> None:
    with pytest.raises(MalformedError, match="not an optimizer tree"):
        _parse(_file({"format": "pt"}))


def test_truncations_and_flips_raise_only_checkpoint_errors() -> None:
    data = _file()
    family = family_named(FAMILY)
    target = family.destination(io.BytesIO(data), 0)
    for cut in range(0, len(data), 7):
        with pytest.raises(CheckpointError):
            family.read(io.BytesIO(data[:cut]), target, True, 0)
    rng = np.random.default_rng(3)
    for _ in range(300):
        mutated = bytearray(data)
        mutated[int(rng.integers(0, len(data)))] ^= int(rng.integers(1, 256))
        with contextlib.suppress(CheckpointError):  # a flipped tensor byte still loads
            family.read(io.BytesIO(bytes(mutated)), target, True, 0)

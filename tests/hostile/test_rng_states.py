"""Crafted random states in a resealed training-state document (issue #20, item 5).

numpy's legacy generator takes any ``pos`` and reads ``key[pos]`` at the next draw: a set
whose numpy state has ``pos = 2**31 - 1`` (digests recomputed) used to verify, restore, and
then kill the process at ``np.random.random()``. Every random state is now checked whole
before anything is installed: a crafted one is a ``MalformedError`` naming the field (or a
``ConfigError`` where torch refuses it), ``verify_checkpoint`` refuses the numpy and
``random`` states too, and every live generator is left as it was.
"""

from __future__ import annotations

import math
import os
import random
import shutil
import struct
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from set_editing import edit_training_state

import tlckpt
from tlckpt import (
    CheckpointError,
    MalformedError,
    load_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)
from tlckpt.codec.sets.rng_states import check_numpy_state, check_random_state
from tlckpt.runtime.sets.rng_states import CPU_STATE_BYTES, cpu_state

_HERE = Path(__file__).resolve().parent
_ROOT = Path(tlckpt.__file__).resolve().parent.parent  # the folder holding the package

_CHILD = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    import numpy as np
    import torch
    from set_editing import edit_training_state

    from tlckpt import CheckpointError, load_checkpoint, save_checkpoint

    folder = Path(sys.argv[1])
    model = torch.nn.Linear(2, 2)
    save_checkpoint(folder, model=model, step=1)
    edit_training_state(
        folder, lambda d: d["rng"]["numpy"]["state"].__setitem__("pos", 2**31 - 1)
    )
    try:
        load_checkpoint(folder, model=model, rng=True)
        print("installed", flush=True)
    except CheckpointError as exc:
        print("refused", exc.field, flush=True)
    print("drew", np.random.random(), flush=True)
    """
)


def test_a_crafted_numpy_position_is_refused_not_a_crash(tmp_path: Path) -> None:
    """In a child: the old code printed "installed" and died of SIGSEGV at the draw."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(_ROOT), str(_HERE)])}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp_path / "s")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr[-2000:])
    assert "refused rng.numpy.state.pos" in done.stdout and "drew" in done.stdout


# --------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def saved_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("rng") / "s"
    torch.manual_seed(3)
    np.random.seed(3)
    random.seed(3)
    torch.randn(3)  # a cached normal sample, and a position other than the seeded one
    np.random.standard_normal()  # numpy's has_gauss set
    save_checkpoint(folder, model=torch.nn.Linear(2, 2), step=1)
    return folder


def _live() -> tuple[Any, ...]:
    numpy_state = np.random.get_state(legacy=False)
    return (
        torch.get_rng_state().numpy().tobytes(),
        numpy_state["state"]["key"].tobytes(),
        numpy_state["state"]["pos"],
        numpy_state["has_gauss"],
        numpy_state["gauss"],
        random.getstate(),
    )


def _restore_edited(saved_set: Path, tmp_path: Path, edit: Callable[[dict], None]) -> Path:
    """Copy the set, edit it, restore it with rng=True: refused, every generator as it was."""
    folder = tmp_path / "edited"
    shutil.copytree(saved_set, folder)
    edit_training_state(folder, edit)
    model = torch.nn.Linear(2, 2)  # built first: its initialisation draws from torch's generator
    torch.manual_seed(11)
    np.random.seed(11)
    random.seed(11)
    before = _live()
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(folder, model=model, rng=True)
    assert _live() == before
    return caught


_NAN = "0x7ff8000000000000"  # the bits of a NaN, as the document tags them


def _numpy(edit: Callable[[dict], None]) -> Callable[[dict], None]:
    return lambda d: edit(d["rng"]["numpy"])


def _words(document: dict) -> list:
    return document["rng"]["random"]["$tuple"][1]["$tuple"]


NUMPY_EDITS = {
    "pos_huge": ("state.pos", _numpy(lambda n: n["state"].__setitem__("pos", 2**31 - 1))),
    "pos_625": ("state.pos", _numpy(lambda n: n["state"].__setitem__("pos", 625))),
    "pos_negative": ("state.pos", _numpy(lambda n: n["state"].__setitem__("pos", -1))),
    "pos_bool": ("state.pos", _numpy(lambda n: n["state"].__setitem__("pos", True))),
    "pos_float": ("state.pos", _numpy(lambda n: n["state"].__setitem__("pos", 3.0))),
    "key_short": ("state.key", _numpy(lambda n: n["state"]["key"].pop())),
    "key_long": ("state.key", _numpy(lambda n: n["state"]["key"].append(1))),
    "word_33_bits": ("state.key[5]", _numpy(lambda n: n["state"]["key"].__setitem__(5, 2**32))),
    "word_negative": ("state.key[0]", _numpy(lambda n: n["state"]["key"].__setitem__(0, -1))),
    "word_float": ("state.key[7]", _numpy(lambda n: n["state"]["key"].__setitem__(7, 1.5))),
    "key_zero": ("state.key", _numpy(lambda n: n["state"].__setitem__("key", [0] * 624))),
    "generator": ("bit_generator", _numpy(lambda n: n.__setitem__("bit_generator", "PCG64"))),
    "has_gauss_2": ("has_gauss", _numpy(lambda n: n.__setitem__("has_gauss", 2))),
    "has_gauss_bool": ("has_gauss", _numpy(lambda n: n.__setitem__("has_gauss", True))),
    "gauss_text": ("gauss", _numpy(lambda n: n.__setitem__("gauss", "x"))),
    "gauss_int": ("gauss", _numpy(lambda n: n.__setitem__("gauss", 1))),
    "gauss_nan": (
        "gauss",
        _numpy(lambda n: n.__setitem__("gauss", {"$float": "0x7ff8000000000000"})),
    ),
    "unknown_key": ("", _numpy(lambda n: n.__setitem__("more", 1))),
    "no_state": ("", _numpy(lambda n: n.pop("state"))),
    "state_list": ("state", _numpy(lambda n: n.__setitem__("state", [1, 2]))),
    "legacy_tuple": ("", lambda d: d["rng"].__setitem__("numpy", {"$tuple": ["MT19937", 1]})),
}

RANDOM_EDITS = {
    "version_2": ("[0]", lambda d: d["rng"]["random"]["$tuple"].__setitem__(0, 2)),
    "words_624": ("[1]", lambda d: _words(d).pop()),
    "words_626": ("[1]", lambda d: _words(d).append(1)),
    "word_33_bits": ("[1][3]", lambda d: _words(d).__setitem__(3, 2**32 + 5)),
    "word_negative": ("[1][3]", lambda d: _words(d).__setitem__(3, -2)),
    "word_bool": ("[1][2]", lambda d: _words(d).__setitem__(2, True)),
    "index_625": ("[1][624]", lambda d: _words(d).__setitem__(624, 625)),
    "index_negative": ("[1][624]", lambda d: _words(d).__setitem__(624, -1)),
    "zero_words": ("[1]", lambda d: _words(d).__setitem__(slice(0, 624), [0] * 624)),
    "words_list": (
        "[1]",
        lambda d: d["rng"]["random"]["$tuple"].__setitem__(1, [1] * 625),
    ),
    "gauss_next_text": ("[2]", lambda d: d["rng"]["random"]["$tuple"].__setitem__(2, "x")),
    "gauss_next_inf": (
        "[2]",
        lambda d: d["rng"]["random"]["$tuple"].__setitem__(2, {"$float": "0x7ff0000000000000"}),
    ),
    "not_a_tuple": ("", lambda d: d["rng"].__setitem__("random", [3, 1, None])),
}


@pytest.mark.parametrize("name", sorted(NUMPY_EDITS))
def test_numpy_states_are_checked_whole(saved_set: Path, tmp_path: Path, name: str) -> None:
    where, edit = NUMPY_EDITS[name]
    caught = _restore_edited(saved_set, tmp_path, edit)
    assert isinstance(caught.value, MalformedError)
    assert caught.value.field == ("rng.numpy." + where).rstrip("."), caught.value
    with pytest.raises(MalformedError):
        verify_checkpoint(tmp_path / "edited")


@pytest.mark.parametrize("name", sorted(RANDOM_EDITS))
def test_random_states_are_checked_whole(saved_set: Path, tmp_path: Path, name: str) -> None:
    where, edit = RANDOM_EDITS[name]
    caught = _restore_edited(saved_set, tmp_path, edit)
    assert isinstance(caught.value, MalformedError)
    assert caught.value.field == "rng.random" + where, caught.value
    with pytest.raises(MalformedError):
        verify_checkpoint(tmp_path / "edited")


# torch's CPU state: the fields of CPUGeneratorImplState (see tlckpt.runtime.sets.rng_states).
def _torch_bytes(edit: Callable[[bytearray], None]) -> Callable[[dict], None]:
    def apply(document: dict) -> None:
        data = bytearray.fromhex(document["rng"]["torch"])
        edit(data)
        document["rng"]["torch"] = data.hex()

    return apply


TORCH_EDITS = {
    "short": lambda b: b.pop(),
    "legacy_size": lambda b: b.__delitem__(slice(5048, None)),  # torch takes it, and guesses
    "left_and_next_disagree": lambda b: struct.pack_into("=iiQ", b, 8, 624, 1, 624),
    "left_zero": lambda b: struct.pack_into("=i", b, 8, 0),
    "unseeded": lambda b: struct.pack_into("=i", b, 12, 0),
    "seeded_2": lambda b: struct.pack_into("=i", b, 12, 2),
    "word_33_bits": lambda b: struct.pack_into("=Q", b, 24 + 8 * 100, 2**32),
    "normal_flag_2": lambda b: struct.pack_into("=i", b, 5040, 2),
    "float_flag_2": lambda b: b.__setitem__(5052, 2),
    "normal_nan": lambda b: struct.pack_into("=d", b, 5024, math.nan),
    "normal_x_set": lambda b: struct.pack_into("=d", b, 5016, 0.5),  # torch writes 0.0
    "padding": lambda b: b.__setitem__(5055, 1),
}


@pytest.mark.parametrize("name", sorted(TORCH_EDITS))
def test_torch_cpu_states_are_checked_whole(saved_set: Path, tmp_path: Path, name: str) -> None:
    caught = _restore_edited(saved_set, tmp_path, _torch_bytes(TORCH_EDITS[name]))
    assert caught.value.field == "rng.torch", caught.value


def test_the_layout_is_this_torchs() -> None:
    torch.manual_seed(5)
    torch.randn(2)
    torch.randn(2, dtype=torch.float64)
    state = torch.get_rng_state()
    assert state.numel() == CPU_STATE_BYTES
    assert torch.equal(cpu_state(state.numpy().tobytes()), state)
    torch.manual_seed(6)  # right after seeding: left 1, next 0
    assert torch.equal(cpu_state(torch.get_rng_state().numpy().tobytes()), torch.get_rng_state())


def test_cuda_states_without_devices_are_refused(saved_set: Path, tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this process has CUDA devices: tests/runtime/test_cuda.py covers them")
    caught = _restore_edited(
        saved_set, tmp_path, lambda d: d["rng"].__setitem__("cuda", ["00" * 16])
    )
    assert caught.value.field == "rng.cuda"


def test_genuine_states_round_trip(saved_set: Path) -> None:
    np.random.seed(1)
    random.seed(1)
    np.random.standard_normal()
    random.gauss()
    numpy_state = np.random.get_state(legacy=False)
    plain = {**numpy_state, "state": {**numpy_state["state"]}}
    plain["state"]["key"] = numpy_state["state"]["key"].tolist()
    assert check_numpy_state(plain) == plain
    assert check_random_state(random.getstate()) == random.getstate()
    random.seed(2)
    assert check_random_state(random.getstate()) == random.getstate()  # gauss_next None


def test_another_numpy_bit_generator_is_refused_at_save(tmp_path: Path) -> None:
    """The reader takes MT19937 states only; the writer refuses the rest before writing."""
    original = np.random.get_bit_generator()
    np.random.set_bit_generator(np.random.PCG64(1))
    try:
        with pytest.raises(CheckpointError) as caught:
            save_checkpoint(tmp_path / "s", model=torch.nn.Linear(2, 2))
    finally:
        np.random.set_bit_generator(original)
    assert caught.value.field == "rng.numpy.bit_generator" and "PCG64" in str(caught.value)
    assert not (tmp_path / "s").exists()

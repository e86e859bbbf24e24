"""``TlckptCheckpointIO`` with real Lightning trainers (``lightning.pytorch`` and
``pytorch_lightning``), on the CPU, with a tiny MLP (dropout, AdamW, StepLR stepped per
step): checkpoints every 5 steps of 10 are verified sets; a fresh trainer resumed from step 5
ends bit-identical to the uninterrupted run (also through ``AsyncCheckpointIO``, and through
``ckpt_path="last"`` when the newest set is damaged); loads unpickle nothing; values JSON
cannot hold are refused before anything is written.
"""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("lightning")
pytest.importorskip("pytorch_lightning")

from tlckpt.cli.main import main as cli_main
from tlckpt.codec.errors import CheckpointError, IntegrityError
from tlckpt.codec.sets.checkpoint_set import verify_checkpoint
from tlckpt.codec.sets.set_folders import SkippedCheckpointWarning, read_manifest
from tlckpt.integrations.lightning import (
    RANDOM_STATES_KEY,
    TlckptCheckpointIO,
    TlckptRandomStates,
)

FLAVORS = ("lightning.pytorch", "pytorch_lightning")
STEP_5, STEP_10 = "epoch=0-step=5.ckpt", "epoch=1-step=10.ckpt"


def _module_class(pl: Any) -> type:
    class Net(pl.LightningModule):
        def __init__(self, width: int = 16, config: Any = None) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.net = torch.nn.Sequential(
                torch.nn.Linear(4, width),
                torch.nn.ReLU(),
                torch.nn.Dropout(0.5),
                torch.nn.Linear(width, 1),
            )

        def training_step(self, batch: Any, index: int) -> torch.Tensor:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> Any:
            opt = torch.optim.AdamW(self.parameters(), lr=1e-2, weight_decay=0.1)
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    return Net


def _data() -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(20, 4, generator=g), torch.randn(20, 1, generator=g)
    # 5 batches an epoch, shuffled (the sampler draws from torch's global generator).
    return torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, y), batch_size=4, shuffle=True
    )


def _fit(
    flavor: str,
    dirpath: Path,
    *,
    ckpt_path: str | None = None,
    io: Any = None,
    callbacks: tuple = (),
    save_last: Any = None,
    max_steps: int = 10,
    model_kwargs: dict | None = None,
) -> Any:
    """Seed, build and fit; returns the module. Checkpoints every 5 steps, all kept."""
    pl = importlib.import_module(flavor)
    pl.seed_everything(0, verbose=False)
    model = _module_class(pl)(**(model_kwargs or {}))
    checkpoints = pl.callbacks.ModelCheckpoint(
        dirpath=dirpath, every_n_train_steps=5, save_top_k=-1, save_last=save_last
    )
    trainer = pl.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        plugins=[io if io is not None else TlckptCheckpointIO()],
        callbacks=[checkpoints, *callbacks],
        enable_progress_bar=False,
        logger=False,
        enable_model_summary=False,
        enable_checkpointing=True,
    )
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=".*(LeafSpec|dirpath has changed|num_workers|not empty).*"
        )
        trainer.fit(model, _data(), ckpt_path=ckpt_path)
    return model


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    left, right = a.state_dict(), b.state_dict()
    return list(left) == list(right) and all(torch.equal(left[k], right[k]) for k in left)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Any]]:
    """Each flavour's uninterrupted 10-step run: its checkpoint folder and final module."""
    runs = {}
    for flavor in FLAVORS:
        folder = tmp_path_factory.mktemp(flavor.replace(".", "_"))
        runs[flavor] = folder, _fit(flavor, folder)
    return runs


@pytest.mark.parametrize("flavor", FLAVORS)
def test_resume_from_step_5_is_bit_exact(
    flavor: str, uninterrupted: dict, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    folder, reference = uninterrupted[flavor]
    assert sorted(os.listdir(folder)) == [STEP_5, STEP_10]
    for name in (STEP_5, STEP_10):
        manifest = verify_checkpoint(folder / name)
        assert manifest.version == 3 and manifest.step == {STEP_5: 5, STEP_10: 10}[name]
        assert sorted(os.listdir(folder / name)) == [
            "manifest.json",
            "state.safetensors",
            "training_state.json",
        ]
        assert cli_main(["verify", str(folder / name)]) == 0
        assert "ok (step" in capsys.readouterr().out
    resumed = _fit(flavor, tmp_path, ckpt_path=str(folder / STEP_5))
    assert _same(resumed, reference)
    # The random states are what makes it exact: without them the dropout masks differ.
    without = _fit(flavor, tmp_path / "no-rng", ckpt_path=str(folder / STEP_5),
                   io=TlckptCheckpointIO(rng=False))  # fmt: skip
    assert not _same(without, reference)


def test_the_loaded_dict_is_lightnings_exactly(uninterrupted: dict) -> None:
    folder, _ = uninterrupted["lightning.pytorch"]
    io = TlckptCheckpointIO(rng=False)
    ckpt = io.load_checkpoint(folder / STEP_5)
    assert ckpt["global_step"] == 5 and ckpt["epoch"] == 0
    assert type(ckpt["state_dict"]).__name__ == "OrderedDict"
    assert ckpt["hyper_parameters"] == {"width": 16, "config": None}
    (group,) = ckpt["optimizer_states"][0]["param_groups"]
    assert group["betas"] == (0.9, 0.999) and group["params"] == [0, 1, 2, 3]
    assert ckpt["lr_schedulers"][0]["last_epoch"] == 5
    callback = next(iter(ckpt["callbacks"].values()))
    assert torch.isinf(callback["kth_value"])
    assert RANDOM_STATES_KEY not in ckpt
    # map_location moves every tensor.
    meta = io.load_checkpoint(folder / STEP_5, map_location="meta")
    assert all(t.is_meta for t in meta["state_dict"].values())
    with pytest.raises(TypeError, match="map_location"):
        io.load_checkpoint(folder / STEP_5, map_location={"cuda:0": "cpu"})


def test_resume_through_async_checkpoint_io_is_bit_exact(
    uninterrupted: dict, tmp_path: Path
) -> None:
    from lightning.pytorch.plugins.io import AsyncCheckpointIO

    _, reference = uninterrupted["lightning.pytorch"]
    first = tmp_path / "first"
    run = _fit(
        "lightning.pytorch",
        first,
        io=AsyncCheckpointIO(TlckptCheckpointIO()),
        callbacks=(TlckptRandomStates(),),
    )
    assert _same(run, reference)
    for name in (STEP_5, STEP_10):
        verify_checkpoint(first / name)
    resumed = _fit(
        "lightning.pytorch",
        tmp_path / "second",
        ckpt_path=str(first / STEP_5),
        io=AsyncCheckpointIO(TlckptCheckpointIO()),
        callbacks=(TlckptRandomStates(),),
    )
    assert _same(resumed, reference)


def test_a_background_save_without_the_callback_records_no_random_states(
    tmp_path: Path,
) -> None:
    from lightning.pytorch.plugins.io import AsyncCheckpointIO

    io = AsyncCheckpointIO(TlckptCheckpointIO())
    with pytest.warns(RuntimeWarning, match="TlckptRandomStates"):
        io.save_checkpoint({"global_step": 3, "w": torch.ones(2)}, tmp_path / "a.ckpt")
        io.teardown()  # waits for the save
    from tlckpt.codec.sets.checkpoint_set import VerifiedSet

    with VerifiedSet.open(tmp_path / "a.ckpt") as verified:
        assert verified.training_state().rng is None


def test_last_with_a_damaged_newest_resumes_from_the_previous(
    uninterrupted: dict, tmp_path: Path
) -> None:
    _, reference = uninterrupted["lightning.pytorch"]
    _fit("lightning.pytorch", tmp_path, save_last="link")
    assert os.readlink(tmp_path / "last.ckpt") == STEP_10
    member = tmp_path / STEP_10 / "state.safetensors"
    data = bytearray(member.read_bytes())
    data[-3] ^= 0x40
    member.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="digest"):
        verify_checkpoint(tmp_path / STEP_10)
    with pytest.warns(SkippedCheckpointWarning) as caught:
        resumed = _fit("lightning.pytorch", tmp_path, ckpt_path="last", save_last="link")
    messages = [str(w.message) for w in caught]
    assert any("last.ckpt skipped" in m and "digest" in m for m in messages), messages
    assert any(f"loaded {tmp_path / STEP_5} (step 5)" in m for m in messages), messages
    assert _same(resumed, reference)


def test_a_value_json_cannot_hold_is_refused_naming_its_path(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"hyper_parameters\.config.*Namespace") as caught:
        _fit(
            "lightning.pytorch",
            tmp_path,
            max_steps=5,
            model_kwargs={"config": argparse.Namespace(lr=0.1)},
        )
    assert caught.value.field == "hyper_parameters.config"
    assert "save_hyperparameters(ignore=" in str(caught.value)
    assert os.listdir(tmp_path) == []  # nothing written, no leftover either


def test_a_load_falls_back_only_to_sets_that_verify(tmp_path: Path) -> None:
    io = TlckptCheckpointIO(rng=False)
    io.save_checkpoint({"global_step": 1, "w": torch.zeros(3)}, tmp_path / "a.ckpt")
    io.save_checkpoint({"global_step": 2, "w": torch.ones(3)}, tmp_path / "b.ckpt")
    (tmp_path / "b.ckpt" / "manifest.json").unlink()  # a set never committed
    with pytest.warns(SkippedCheckpointWarning) as caught:
        assert torch.equal(io.load_checkpoint(tmp_path / "b.ckpt")["w"], torch.zeros(3))
    skipped, loaded = (str(w.message) for w in caught)
    assert "b.ckpt skipped" in skipped and "never committed" in skipped
    assert f"loaded {tmp_path / 'a.ckpt'} (step 1)" in loaded
    (tmp_path / "a.ckpt" / "training_state.json").write_text("{}")
    with pytest.warns(SkippedCheckpointWarning), pytest.raises(IntegrityError, match="manifest"):
        io.load_checkpoint(tmp_path / "b.ckpt")
    with pytest.raises(IntegrityError, match="manifest"):
        TlckptCheckpointIO(fallback=False).load_checkpoint(tmp_path / "b.ckpt")
    with pytest.raises(FileNotFoundError):
        io.load_checkpoint(tmp_path / "missing.ckpt")
    torch_file = tmp_path / "torch.ckpt"
    torch_file.write_bytes(b"\x80\x04K\x01.")  # a pickle: never opened as one
    with pytest.raises(CheckpointError, match="not a tlckpt checkpoint set"):
        io.load_checkpoint(torch_file)


def test_remove_checkpoint_leaves_nothing_behind(tmp_path: Path) -> None:
    io = TlckptCheckpointIO()
    io.save_checkpoint({"global_step": 1, "w": torch.zeros(3)}, tmp_path / "a.ckpt")
    io.save_checkpoint({"global_step": 1, "w": torch.ones(3)}, tmp_path / "a.ckpt")  # replaced
    assert torch.equal(io.load_checkpoint(tmp_path / "a.ckpt")["w"], torch.ones(3))
    os.symlink("a.ckpt", tmp_path / "last.ckpt")
    io.remove_checkpoint(tmp_path / "last.ckpt")  # the link, not the set
    assert os.listdir(tmp_path) == ["a.ckpt"]
    io.remove_checkpoint(tmp_path / "a.ckpt")
    io.remove_checkpoint(tmp_path / "a.ckpt")  # nothing there: not an error
    assert os.listdir(tmp_path) == []


def test_loading_unpickles_nothing(uninterrupted: dict) -> None:
    """In a fresh interpreter (audit hooks cannot be removed): after a warm-up, every
    ``pickle.*``/``marshal.*`` audit event and any call of ``torch.load`` or the picklers
    while loading and verifying the checkpoints is recorded; there must be none."""
    folder, _ = uninterrupted["lightning.pytorch"]
    script = textwrap.dedent(
        """
        import pickle, sys, torch
        from tlckpt.cli.main import main
        from tlckpt.codec.sets.checkpoint_set import verify_checkpoint
        from tlckpt.integrations.lightning import TlckptCheckpointIO
        paths = sys.argv[1:]
        io = TlckptCheckpointIO()
        def everything():
            for p in paths:
                io.load_checkpoint(p)
                verify_checkpoint(p)
                main(["verify", p])
        everything()  # warm-up: lazy imports happen before watching
        seen = []
        def tripwire(name):
            def refuse(*a, **k):
                seen.append(name)
                raise RuntimeError(name + " called")
            return refuse
        for name in ("load", "loads", "Unpickler"):
            setattr(pickle, name, tripwire("pickle." + name))
        torch.load = tripwire("torch.load")
        def hook(event, args):
            if event.startswith(("pickle.", "marshal.")):
                seen.append(event)
        sys.addaudithook(hook)
        everything()
        print("SEEN", sorted(set(seen)))
        # The control: an unpickling the hook must see (the C pickler, not tripwired).
        import _pickle, collections
        _pickle.loads(_pickle.dumps(collections.OrderedDict()))
        print("CONTROL", sorted(set(seen)))
        """
    )
    paths = [str(folder / STEP_5), str(folder / STEP_10)]
    done = subprocess.run(
        [sys.executable, "-c", script, *paths],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "SEEN []" in done.stdout, done.stdout[-2000:]
    assert "CONTROL ['pickle.find_class']" in done.stdout, done.stdout[-2000:]


def test_the_sets_are_state_tree_sets(uninterrupted: dict) -> None:
    folder, _ = uninterrupted["pytorch_lightning"]
    manifest = read_manifest(folder / STEP_10)
    names = [name for name, _ in manifest.state]
    assert "state_dict.net.0.weight" in names
    assert any(n.startswith("optimizer_states[0].state[0].exp_avg") for n in names)


@pytest.mark.parametrize(
    "blocked", [("torch",), ("lightning", "pytorch_lightning", "lightning_fabric")]
)
def test_the_module_imports_without_lightning_and_says_what_to_install(
    blocked: tuple[str, ...],
) -> None:
    """In a child whose ``sys.modules`` blocks the packages (what an environment without
    them looks like to ``import``): the module imports; the classes say what to install."""
    script = textwrap.dedent(
        f"""
        import sys
        for name in {blocked!r}:
            sys.modules[name] = None
        from tlckpt.integrations import lightning
        from tlckpt.optional import MissingDependencyError
        for make in (lightning.TlckptCheckpointIO, lightning.TlckptRandomStates):
            try:
                make()
            except MissingDependencyError as exc:
                print("REFUSED", exc)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and all("pip install lightning" in line for line in lines), lines


def test_fabric_takes_the_plug_in_too(tmp_path: Path) -> None:
    from lightning.fabric import Fabric

    fabric = Fabric(accelerator="cpu", plugins=[TlckptCheckpointIO()])
    torch.manual_seed(0)
    model, opt = fabric.setup(*_linear_and_adamw())
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    fabric.save(tmp_path / "f.ckpt", {"model": model, "optimizer": opt, "step": 1})
    verify_checkpoint(tmp_path / "f.ckpt")
    again, again_opt = fabric.setup(*_linear_and_adamw())
    assert fabric.load(tmp_path / "f.ckpt", {"model": again, "optimizer": again_opt}) == {"step": 1}
    assert _same(again, model)
    assert torch.equal(
        again_opt.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"]
    )


def _linear_and_adamw() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Linear(3, 2)
    return model, torch.optim.AdamW(model.parameters())

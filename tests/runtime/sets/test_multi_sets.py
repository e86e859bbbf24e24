"""Checkpoint sets of any training state (issue #21): several models, optimizers and
schedulers (a GAN; two optimizers over one model), bf16 models as safetensors members,
version-2 manifests (signed too), structure refusals with nothing changed, and version-1
sets still read and still written byte for byte."""

from __future__ import annotations

import copy
import json
import random
import shutil
import sys
from pathlib import Path

import pytest
import torch

from tlckpt.codec.errors import CheckpointError, IntegrityError, MalformedError, SchemaMismatchError
from tlckpt.codec.sets.checkpoint_set import verify_checkpoint
from tlckpt.runtime.sets.checkpoint_manager import CheckpointManager
from tlckpt.runtime.sets.checkpoint_sets import load_checkpoint, save_checkpoint

DATA = Path(__file__).parent.parent / "data"
KEY = bytes(range(32))


# --------------------------------------------------------------------------- a GAN


def gan(seed: int):
    torch.manual_seed(seed)
    g = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    d = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    og = torch.optim.Adam(g.parameters(), lr=1e-3)
    od = torch.optim.AdamW(d.parameters(), lr=2e-3, weight_decay=0.1)
    sg = torch.optim.lr_scheduler.StepLR(og, 2, 0.5)
    sd = torch.optim.lr_scheduler.ExponentialLR(od, 0.9)
    return {"G": g, "D": d}, {"G": og, "D": od}, {"G": sg, "D": sd}


def gan_steps(models, opts, scheds, start: int, count: int) -> list[torch.Tensor]:
    g, d = models["G"], models["D"]
    losses = []
    for i in range(start, start + count):
        gen = torch.Generator().manual_seed(i)
        z, real = torch.randn(5, 4, generator=gen), torch.randn(5, 4, generator=gen)
        opts["D"].zero_grad()
        loss_d = d(real).mean() - d(g(z).detach()).mean()
        loss_d.backward()
        opts["D"].step()
        scheds["D"].step()
        opts["G"].zero_grad()
        loss_g = -d(g(z)).mean()
        loss_g.backward()
        opts["G"].step()
        scheds["G"].step()
        losses += [loss_d.detach(), loss_g.detach()]
    return losses


def assert_same_state(a, b) -> None:
    for key in a:
        for (n, x), (_, y) in zip(a[key].state_dict().items(), b[key].state_dict().items()):
            assert torch.equal(x.view(-1).view(torch.uint8), y.view(-1).view(torch.uint8)), n


def snapshot_of(models, opts) -> tuple:
    return (
        {k: copy.deepcopy(m.state_dict()) for k, m in models.items()},
        {k: copy.deepcopy(o.state_dict()) for k, o in opts.items()},
    )


def assert_unchanged(before: tuple, models, opts) -> None:
    states, opt_states = before
    for k, m in models.items():
        for n, t in m.state_dict().items():
            assert torch.equal(t, states[k][n]), (k, n)
    for k, o in opts.items():
        now = o.state_dict()
        assert now["param_groups"] == opt_states[k]["param_groups"]
        assert now["state"].keys() == opt_states[k]["state"].keys()
        for p, entry in now["state"].items():
            for name, value in entry.items():
                assert torch.equal(value, opt_states[k]["state"][p][name])


@pytest.mark.parametrize("blocking", [True, False])
def test_gan_resume_is_bit_exact(tmp_path: Path, blocking: bool) -> None:
    ref = gan(0)
    ref_losses = gan_steps(*ref, 0, 6)
    run = gan(0)
    losses = gan_steps(*run, 0, 3)
    manager = CheckpointManager(tmp_path)
    models, opts, scheds = run
    handle = manager.save(3, model=models, optimizer=opts, scheduler=scheds, blocking=blocking)
    gan_steps(*run, 3, 1)  # training goes on: a background set holds the values at the call
    handle.wait()
    folder = handle.wait()
    assert sorted(p.name for p in folder.iterdir()) == [
        "manifest.json",
        "model.D.tlsf32",
        "model.G.tlsf32",
        "optimizer.D.tladam",
        "optimizer.G.tladam",
        "training_state.json",
    ]
    fresh = gan(5)
    assert manager.restore(model=fresh[0], optimizer=fresh[1], scheduler=fresh[2]).step == 3
    losses += gan_steps(*fresh, 3, 3)
    assert all(torch.equal(a, b) for a, b in zip(losses, ref_losses))
    assert_same_state(fresh[0], ref[0])
    for k in ("G", "D"):
        assert fresh[2][k].state_dict() == ref[2][k].state_dict()
        assert fresh[1][k].param_groups[0]["lr"] == ref[1][k].param_groups[0]["lr"]


def test_manifest_records_members_structure_and_bindings(tmp_path: Path) -> None:
    models, opts, scheds = gan(0)
    gan_steps(models, opts, scheds, 0, 1)
    folder = save_checkpoint(tmp_path / "s", model=models, optimizer=opts, scheduler=scheds)
    doc = json.loads((folder / "manifest.json").read_bytes())
    assert doc["version"] == 2
    assert doc["structure"] == {
        "model": {"kind": "mapping", "keys": ["G", "D"]},
        "optimizer": {"kind": "mapping", "keys": ["G", "D"]},
        "scheduler": {"kind": "mapping", "keys": ["G", "D"]},
    }
    g = doc["members"]["model.G"]
    assert g["tensors"][0] == ["0.weight", [8, 4]] and g["tied"] == {}
    assert doc["members"]["optimizer.D"]["models"] == ["model.D"]
    assert doc["members"]["optimizer.D"]["groups"] == 1
    manifest = verify_checkpoint(folder)
    assert manifest.version == 2 and set(manifest.members) == {
        "model.G",
        "model.D",
        "optimizer.G",
        "optimizer.D",
        "training_state",
    }


def test_structure_mismatch_is_refused_with_nothing_changed(tmp_path: Path) -> None:
    models, opts, scheds = gan(0)
    gan_steps(models, opts, scheds, 0, 2)
    folder = save_checkpoint(tmp_path / "s", model=models, optimizer=opts, scheduler=scheds)
    fresh = gan(3)
    gan_steps(*fresh, 0, 1)
    before = snapshot_of(fresh[0], fresh[1])
    lrs = [o.param_groups[0]["lr"] for o in fresh[1].values()]
    sched_states = {k: s.state_dict() for k, s in fresh[2].items()}
    m, o, s = fresh
    wrong = [
        dict(model=[m["G"], m["D"]], optimizer=[o["G"], o["D"]]),  # a sequence
        dict(model={"G": m["G"], "X": m["D"]}, optimizer=o),  # other keys
        dict(model={"G": m["G"]}, optimizer={"G": o["G"]}),  # fewer
        dict(model=m["G"], optimizer=o["G"]),  # one object
        dict(model=m, optimizer=o, scheduler=s["G"]),  # one scheduler
        dict(model={"D": m["D"], "G": m["G"]}, optimizer=o),  # another order
    ]
    for targets in wrong:
        with pytest.raises(SchemaMismatchError, match=r"structure|given"):
            load_checkpoint(folder, **targets)
        assert_unchanged(before, m, o)
    # Swapped objects under the right keys: the tensors' shapes differ.
    with pytest.raises(SchemaMismatchError):
        load_checkpoint(folder, model={"G": m["D"], "D": m["G"]}, optimizer=o, scheduler=s)
    assert_unchanged(before, m, o)
    assert [x.param_groups[0]["lr"] for x in o.values()] == lrs
    assert {k: x.state_dict() for k, x in s.items()} == sched_states


def test_a_scheduler_that_refuses_rolls_every_scheduler_back(tmp_path: Path) -> None:
    models, opts, scheds = gan(0)
    gan_steps(models, opts, scheds, 0, 2)
    folder = save_checkpoint(tmp_path / "s", model=models, optimizer=opts, scheduler=scheds)
    m, o, s = gan(3)
    before = snapshot_of(m, o)
    g_state = s["G"].state_dict()

    class Refusing(torch.optim.lr_scheduler.ExponentialLR):
        def load_state_dict(self, state):
            raise RuntimeError("no")

    s["D"] = Refusing(o["D"], 0.9)
    with pytest.raises(CheckpointError, match="refused"):
        load_checkpoint(folder, model=m, optimizer=o, scheduler=s)
    assert s["G"].state_dict() == g_state
    assert_unchanged(before, m, o)


def test_renamed_parameter_is_refused_with_nothing_changed(tmp_path: Path) -> None:
    models, opts, _ = gan(0)
    folder = save_checkpoint(tmp_path / "s", model=models, optimizer=opts)
    m, o, _ = gan(1)
    renamed = torch.nn.Module()
    renamed.first, renamed.act, renamed.last = m["D"][0], m["D"][1], m["D"][2]
    before = snapshot_of(m, o)
    with pytest.raises(SchemaMismatchError, match="names differ"):
        load_checkpoint(folder, model={"G": m["G"], "D": renamed}, optimizer=o)
    assert_unchanged(before, m, o)


# --------------------------------------------------------------------------- two optimizers


def split_model(seed: int, dtype: torch.dtype):
    """A model whose matrices Muon trains and whose vectors AdamW trains."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4)
    ).to(dtype)
    matrices = [p for p in model.parameters() if p.ndim == 2]
    rest = [p for p in model.parameters() if p.ndim != 2]
    opts = [torch.optim.Muon(matrices, lr=2e-2), torch.optim.AdamW(rest, lr=3e-3)]
    return model, opts


def split_steps(model, opts, start: int, count: int) -> list[torch.Tensor]:
    losses = []
    for i in range(start, start + count):
        x = torch.randn(6, 8, generator=torch.Generator().manual_seed(i)).to(model[0].weight.dtype)
        loss = model(x).float().pow(2).mean()
        for o in opts:
            o.zero_grad()
        loss.backward()
        for o in opts:
            o.step()
        losses.append(loss.detach())
    return losses


@pytest.mark.parametrize("blocking", [True, False])
def test_muon_and_adamw_over_one_bf16_model_resume_bit_exact(
    tmp_path: Path, blocking: bool
) -> None:
    ref_model, ref_opts = split_model(0, torch.bfloat16)
    ref_losses = split_steps(ref_model, ref_opts, 0, 6)
    model, opts = split_model(0, torch.bfloat16)
    losses = split_steps(model, opts, 0, 3)
    manager = CheckpointManager(tmp_path)
    folder = manager.save(3, model=model, optimizer=opts, blocking=blocking).wait()
    names = sorted(p.name for p in folder.iterdir())
    assert names == [
        "manifest.json",
        "model.safetensors",
        "optimizer.0.safetensors",  # Muon: an optimizer tree
        "optimizer.1.tladam",  # AdamW
        "training_state.json",
    ]
    fresh, fresh_opts = split_model(9, torch.bfloat16)
    manager.restore(model=fresh, optimizer=fresh_opts)
    losses += split_steps(fresh, fresh_opts, 3, 3)
    assert all(torch.equal(a, b) for a, b in zip(losses, ref_losses))
    for (n, a), (_, b) in zip(fresh.state_dict().items(), ref_model.state_dict().items()):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), n
    doc = json.loads((folder / "manifest.json").read_bytes())
    assert doc["structure"]["optimizer"] == {"kind": "sequence", "keys": ["0", "1"]}
    assert doc["members"]["optimizer.0"]["models"] == ["model"]
    assert doc["members"]["optimizer.0"]["family"] == "optimizer_tree"
    assert verify_checkpoint(folder).members["optimizer.0"].family == "optimizer_tree"
    # The optimizers in the other order: their parameters are other ones.
    again, again_opts = split_model(9, torch.bfloat16)
    with pytest.raises(CheckpointError):
        manager.restore(model=again, optimizer=again_opts[::-1])
    assert all(not o.state for o in again_opts)


def test_one_sgd_optimizer_is_a_version_2_set(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(2, 3)).sum().backward()
    opt.step()
    folder = save_checkpoint(tmp_path / "s", model=model, optimizer=opt)
    doc = json.loads((folder / "manifest.json").read_bytes())
    assert doc["version"] == 2 and doc["members"]["optimizer"]["file"] == "optimizer.safetensors"
    fresh = torch.nn.Linear(3, 3)
    fresh_opt = torch.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9)
    load_checkpoint(folder, model=fresh, optimizer=fresh_opt)
    assert torch.equal(
        fresh_opt.state[fresh.weight]["momentum_buffer"], opt.state[model.weight]["momentum_buffer"]
    )


def test_an_optimizer_tree_named_tladam_by_an_older_writer_still_restores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sets written before optimizer-tree members were named ``.safetensors`` called them
    ``optimizer.tladam``: they verify, are described by their family, and restore."""
    from tlckpt.runtime.sets import multi_set_writing

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 3)
    opt = torch.optim.RMSprop(model.parameters(), lr=0.01)
    model(torch.ones(2, 3)).sum().backward()
    opt.step()
    with monkeypatch.context() as patched:
        patched.setattr(multi_set_writing, "SAFETENSORS", ".tladam")  # the older name
        folder = save_checkpoint(tmp_path / "s", model=model, optimizer=opt)
    record = verify_checkpoint(folder).members["optimizer"]
    assert (record.file, record.family) == ("optimizer.tladam", "optimizer_tree")
    fresh = torch.nn.Linear(3, 3)
    fresh_opt = torch.optim.RMSprop(fresh.parameters(), lr=0.01)
    load_checkpoint(folder, model=fresh, optimizer=fresh_opt)
    assert torch.equal(
        fresh_opt.state[fresh.weight]["square_avg"], opt.state[model.weight]["square_avg"]
    )


def test_bf16_model_member_is_the_safetensors_file(tmp_path: Path) -> None:
    safetensors_torch = pytest.importorskip("safetensors.torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)]).to(torch.bfloat16)
    folder = save_checkpoint(tmp_path / "s", model=model)
    reference = tmp_path / "ref.safetensors"
    safetensors_torch.save_file(model.state_dict(), str(reference))
    member = folder / "model.safetensors"
    assert member.stat().st_size <= 1.01 * reference.stat().st_size
    assert safetensors_torch.load_file(str(member)).keys() == model.state_dict().keys()
    assert verify_checkpoint(folder).members["model"].family == "safetensors"
    fresh = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)]).to(torch.bfloat16)
    load_checkpoint(folder, model=fresh)
    assert all(torch.equal(a, b) for a, b in zip(fresh.parameters(), model.parameters()))
    # model_format="torchlean" keeps the exact-bits JSON member TorchLean reads.
    torchlean = save_checkpoint(tmp_path / "t", model=model, model_format="torchlean")
    assert (torchlean / "model.json").exists()
    assert json.loads((torchlean / "manifest.json").read_bytes())["version"] == 1
    with pytest.raises(ValueError, match="model_format"):
        CheckpointManager(tmp_path / "m", model_format="pickle")


def test_tied_weights_are_recorded_and_stay_tied(tmp_path: Path) -> None:
    torch.manual_seed(0)

    def tied() -> torch.nn.Module:
        m = torch.nn.Module()
        m.emb, m.head = torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False)
        m.head.weight = m.emb.weight
        return m.to(torch.float16)

    model = tied()
    folder = save_checkpoint(tmp_path / "s", model={"lm": model})
    record = json.loads((folder / "manifest.json").read_bytes())["members"]["model.lm"]
    assert record["tied"] == {"head.weight": "emb.weight"}
    fresh = tied()
    load_checkpoint(folder, model={"lm": fresh})
    assert fresh.head.weight is fresh.emb.weight and torch.equal(fresh.emb.weight, model.emb.weight)


def test_an_optimizer_over_two_models_binds_to_both(tmp_path: Path) -> None:
    def build(seed: int):
        torch.manual_seed(seed)
        enc, dec = torch.nn.Linear(3, 3), torch.nn.Linear(3, 2)
        return {"enc": enc, "dec": dec}, torch.optim.Adam([*enc.parameters(), *dec.parameters()])

    models, opt = build(0)
    models["dec"](models["enc"](torch.ones(2, 3))).sum().backward()
    opt.step()
    folder = save_checkpoint(tmp_path / "s", model=models, optimizer={"joint": opt})
    record = json.loads((folder / "manifest.json").read_bytes())["members"]["optimizer.joint"]
    assert record["models"] == ["model.enc", "model.dec"]
    fresh, fresh_opt = build(1)
    load_checkpoint(folder, model=fresh, optimizer={"joint": fresh_opt})
    for a, b in zip(fresh_opt.state_dict()["state"].values(), opt.state_dict()["state"].values()):
        assert all(torch.equal(a[k], b[k]) for k in ("exp_avg", "exp_avg_sq"))
    stray = torch.optim.Adam([torch.nn.Parameter(torch.ones(2))])
    with pytest.raises(SchemaMismatchError, match="no model of the set"):
        save_checkpoint(tmp_path / "t", model=models, optimizer={"joint": opt, "x": stray})
    assert not (tmp_path / "t").exists()


def test_bad_structures_are_refused_before_writing(tmp_path: Path) -> None:
    models, opts, _ = gan(0)
    for kwargs in (
        dict(model={"a/b": models["G"]}),
        dict(model={}),
        dict(model=[models["G"], "not a module"]),
        dict(model=models, optimizer=[opts["G"], 3]),
    ):
        with pytest.raises(CheckpointError):
            save_checkpoint(tmp_path / "s", **kwargs)
        assert not (tmp_path / "s").exists()


# --------------------------------------------------------------------------- versions and keys


def test_version_1_sets_restore_and_are_still_written_byte_for_byte(tmp_path: Path) -> None:
    sys.path.insert(0, str(DATA))
    try:
        import make_set_v1 as v1
    finally:
        sys.path.remove(str(DATA))
    model, opt, sched = v1.build(0)
    v1.train(model, opt, sched, 2)
    fresh, fresh_opt, fresh_sched = v1.build(3)
    restored = load_checkpoint(
        DATA / "set_v1", model=fresh, optimizer=fresh_opt, scheduler=fresh_sched
    )
    assert restored.step == 2 and restored.extra == {"note": "v1"}
    assert all(torch.equal(a, b) for a, b in zip(fresh.parameters(), model.parameters()))
    assert fresh_sched.state_dict() == sched.state_dict()
    v1.seed_globals()
    again = save_checkpoint(
        tmp_path / "again",
        model=model,
        optimizer=opt,
        scheduler=sched,
        step=2,
        extra={"note": "v1"},
    )
    for name in ("manifest.json", "model.tlsf32", "optimizer.tladam", "training_state.json"):
        assert (again / name).read_bytes() == (DATA / "set_v1" / name).read_bytes(), name
    # A version-1 set is one object of each: another structure is refused.
    with pytest.raises(SchemaMismatchError, match=r"structure|given"):
        load_checkpoint(DATA / "set_v1", model=[fresh], optimizer=[fresh_opt])


def test_signed_multi_member_sets(tmp_path: Path) -> None:
    models, opts, scheds = gan(0)
    gan_steps(models, opts, scheds, 0, 1)
    manager = CheckpointManager(tmp_path / "run", key=KEY)
    folder = manager.save(1, model=models, optimizer=opts, scheduler=scheds, blocking=False).wait()
    doc = json.loads((folder / "manifest.json").read_bytes())
    assert doc["version"] == 2 and doc["digest"] == "blake3_keyed" and "mac" in doc
    fresh = gan(2)
    manager.restore(model=fresh[0], optimizer=fresh[1], scheduler=fresh[2])
    assert_same_state(fresh[0], models)
    with pytest.raises(CheckpointError):
        load_checkpoint(folder, model=fresh[0], optimizer=fresh[1])  # no key
    # The MAC covers the new fields: an edited binding or tie is refused.
    edits = ((b'"groups":1', b'"groups":2'), (b'"tied":{}', b'"tied":{"2.bias":"0.bias"}'))
    for i, (old, new) in enumerate(edits):
        copy_dir = tmp_path / f"edit{i}"
        shutil.copytree(folder, copy_dir)
        data = (copy_dir / "manifest.json").read_bytes()
        assert old in data
        (copy_dir / "manifest.json").write_bytes(data.replace(old, new, 1))
        with pytest.raises(IntegrityError, match=r"MAC|mac"):
            verify_checkpoint(copy_dir, key=KEY)


def test_hostile_version_2_manifests_are_refused(tmp_path: Path) -> None:
    models, opts, _ = gan(0)
    folder = save_checkpoint(tmp_path / "s", model=models, optimizer=opts)
    data = (folder / "manifest.json").read_bytes()
    edits = [
        (b'"file":"model.G.tlsf32"', b'"file":"../model.G.tlsf32"'),
        (b'"keys":["G","D"]', b'"keys":["G","G"]'),
        (b'"models":["model.D"]', b'"models":["model.Z"]'),
        (b'"kind":"mapping"', b'"kind":"tree"'),
        (b'"groups":1', b'"groups":-1'),
    ]
    for old, new in edits:
        assert old in data, old
        doc = json.loads(data.replace(old, new, 1))
        del doc["self_digest"]
        # Re-digested, so that the field checks (not the digest) refuse it.
        from tlckpt.codec.sets.set_documents import self_digest

        doc["self_digest"] = self_digest(doc)
        edited = tmp_path / f"e{edits.index((old, new))}"
        shutil.copytree(folder, edited)
        (edited / "manifest.json").write_bytes(json.dumps(doc, separators=(",", ":")).encode())
        with pytest.raises(MalformedError):
            verify_checkpoint(edited)


def test_cli_ls_and_verify_name_the_members(tmp_path: Path) -> None:
    from tlckpt.cli.sets import list_sets, verify_set

    models, opts, scheds = gan(0)
    manager = CheckpointManager(tmp_path)
    folder = manager.save(7, model=models, optimizer=opts, scheduler=scheds).wait()
    listing = list_sets(tmp_path)
    assert "model.G.tlsf32" in listing and "optimizer.D.tladam" in listing
    report = verify_set(folder)
    assert "ok" in report and "model.D.tlsf32" in report


def test_random_states_restored_only_with_rng(tmp_path: Path) -> None:
    models, opts, scheds = gan(0)
    saved = torch.get_rng_state()
    folder = save_checkpoint(tmp_path / "s", model=models, optimizer=opts, scheduler=scheds)
    fresh = gan(1)
    state = (torch.get_rng_state(), random.getstate())
    load_checkpoint(folder, model=fresh[0], optimizer=fresh[1], scheduler=fresh[2])
    assert torch.equal(torch.get_rng_state(), state[0]) and random.getstate() == state[1]
    load_checkpoint(folder, model=fresh[0], optimizer=fresh[1], scheduler=fresh[2], rng=True)
    assert torch.equal(torch.get_rng_state(), saved)


def test_a_damaged_member_changes_nothing_and_restore_falls_back(tmp_path: Path) -> None:
    models, opts, scheds = gan(0)
    manager = CheckpointManager(tmp_path)
    gan_steps(models, opts, scheds, 0, 1)
    manager.save(1, model=models, optimizer=opts, scheduler=scheds)
    gan_steps(models, opts, scheds, 1, 1)
    newest = manager.save(2, model=models, optimizer=opts, scheduler=scheds).wait()
    member = newest / "optimizer.D.tladam"
    data = bytearray(member.read_bytes())
    data[-1] ^= 1
    member.write_bytes(bytes(data))
    m, o, s = gan(4)
    gan_steps(m, o, s, 0, 1)
    before = snapshot_of(m, o)
    with pytest.raises(IntegrityError, match=r"optimizer\.D"):
        load_checkpoint(newest, model=m, optimizer=o, scheduler=s)
    assert_unchanged(before, m, o)
    with pytest.warns(UserWarning, match="step 2 skipped"):
        assert manager.restore(model=m, optimizer=o, scheduler=s).step == 1


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_background_save_of_a_gan_holds_the_values_at_the_call(tmp_path: Path) -> None:
    """Every model's and optimizer's device tensors are copied into the one pinned arena at
    the call; a bf16 model on the device restores into device tensors."""
    models, _, _ = gan(0)
    models["G"].to("cuda", torch.bfloat16)
    models["D"].cuda()
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-2) for k, m in models.items()}
    x = torch.randn(5, 4, device="cuda")
    models["D"](models["G"](x.bfloat16()).float()).sum().backward()
    for o in opts.values():
        o.step()
    at_call = {
        k: {n: t.detach().cpu().clone() for n, t in m.state_dict().items()}
        for k, m in models.items()
    }
    manager = CheckpointManager(tmp_path)
    handle = manager.save(1, model=models, optimizer=opts, blocking=False)
    with torch.no_grad():  # queued right behind the copies on the training stream
        for m in models.values():
            for p in m.parameters():
                p.mul_(-2.0).add_(1.0)
    folder = handle.wait()
    assert (folder / "model.G.safetensors").exists() and (folder / "model.D.tlsf32").exists()
    fresh, _, _ = gan(3)
    fresh["G"].to("cuda", torch.bfloat16)
    fresh["D"].cuda()
    fresh_opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-2) for k, m in fresh.items()}
    manager.restore(model=fresh, optimizer=fresh_opts)
    for k, m in fresh.items():
        for n, t in m.state_dict().items():
            assert t.is_cuda and torch.equal(t.cpu(), at_call[k][n]), (k, n)
    assert all(s["exp_avg"].is_cuda for o in fresh_opts.values() for s in o.state.values())


def test_a_model_of_mixed_dtypes_is_a_safetensors_member(tmp_path: Path) -> None:
    def mixed() -> torch.nn.Module:
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 3))
        m[1].to(torch.bfloat16)
        return m

    model = mixed()
    folder = save_checkpoint(tmp_path / "s", model=model)
    assert (folder / "model.safetensors").exists()
    fresh = mixed()
    with torch.no_grad():
        for p in fresh.parameters():
            p.zero_()
    load_checkpoint(folder, model=fresh)
    assert all(torch.equal(a, b) for a, b in zip(fresh.parameters(), model.parameters()))
    with pytest.raises(CheckpointError, match="mix"):
        save_checkpoint(tmp_path / "t", model=model, model_format="torchlean")

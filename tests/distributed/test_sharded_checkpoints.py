"""Sharded (FSDP2 / DTensor) models and optimizers through torch.distributed (gloo, CPU).

World sizes 2 and 3 run as process groups (``conftest.groups``), then 2 again and a one-rank
group (``LATER``); world size 1 is also this process. Directions: 1 → 2, 1 → 3 (a
single-process file into shards), 2 → 2, 3 → 3 (resume), 2 → 3 and 3 → 2 (resharding),
2 → 1 and 3 → 1 (into one process, and into a one-rank group). Sharded calls take the
parallel path (every rank its own bytes) wherever the probe finds /tmp shared, which it is
here; ``both_paths``, ``injected_failures``, ``hsdp_meshes`` and ``rank_local_failures``
force the streaming path through rank 0 as well (``TLCKPT_SHARDED_IO=rank0``). The model is FSDP2
``fully_shard`` over a 1-D mesh (also HSDP 2-D meshes); DTensors from ``distribute_tensor``
with ``Shard(0)``, ``Shard(1)`` and ``Replicate()`` placements cover the other layouts.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from sharded_support import (
    CHECKS_OF_WORLD,
    LATER,
    K,
    N,
    differences,
    max_difference,
    plain_copy,
    snapshot,
)

from tlckpt.runtime import load_module_state, load_optimizer, load_state_bits, schema_of
from tlckpt.testing.models import TiedNet, make_adam, train

pytestmark = pytest.mark.distributed

WORLDS = [2, 3]


def report(groups: dict[str, Any], world: Any, name: str) -> list[dict[str, Any]]:
    """Every rank's result of one check, after asserting that it ran everywhere.

    ``world``: the group's world size, or its label (``conftest.LATER``)."""
    size = LATER[world][0] if world in LATER else world
    ranks = groups[world]
    results = [r.get(name) for r in ranks]
    if len(ranks) != size or any(r is None or not r["ok"] for r in results):
        errors = [r.get("error") if r else "missing" for r in results]
        pytest.fail(f"check {name} failed in world {world}: {errors}\n{groups[f'output{world}']}")
    return results


@pytest.mark.parametrize("world", WORLDS)
def test_sharded_files_are_byte_identical_to_single_process_files(groups, world):
    results = report(groups, world, "sharded_run")
    writer = results[0]
    assert writer["identical"] == {
        "model.tlsf32": True,
        "state.json": True,
        "opt.tladam": True,
        "generator.tladam": True,
        "mapping.tlsf32": True,
    }
    assert {r["version"] for r in results} == {4}  # tied float32 with a random counter
    assert {r["model_route"] for r in results} == {"parallel"}  # the probe found /tmp shared
    # Slots, tied weights and frozen parameters as one process sees them, on every rank
    # (also on ranks whose shard of a tied or frozen parameter is empty).
    assert all(r["same_schema"] for r in results)
    # The shards really were uneven, and some rank holds an empty one in world 3.
    rows = [r["local_shapes"]["emb.weight"][0] for r in results]
    assert sum(rows) == 7 and len(set(rows)) > 1
    if world == 3:
        assert any(r["local_shapes"]["mix.weight"][0] == 0 for r in results)


@pytest.mark.parametrize("world", WORLDS)
def test_resume_in_the_same_world_is_bit_exact(groups, world):
    for r in report(groups, world, "resume_same_world"):
        assert r["fresh_differs"]
        assert r["counter"] == K
        assert r["after_load"] == [] and r["slices"] == []
        assert r["after_training"] == []  # the continuation equals the uninterrupted run
        assert r["tied"]
        assert r["after_bits_load"] == []


@pytest.mark.parametrize("world", WORLDS)
def test_single_process_file_loads_into_shards_as_their_rows(groups, world):
    for r in report(groups, world, "single_process_file_into_shards"):
        assert r["slices"] == [] and r["gathered"] == [] and r["bits_slices"] == []


def test_world2_save_loads_into_world3(groups):
    for r in report(groups, 3, "other_world_into_shards"):
        assert r["counter"] == K
        assert r["after_load"] == [] and r["slices"] == []
        # Bit for bit against a 3-rank run from the same values installed by hand ...
        assert r["matches_same_arithmetic"] == []
        # ... and to within rounding against the 2-rank run's own continuation: FSDP2's
        # arithmetic differs between world sizes (even 2 ranks differ from one process).
        assert r["continuation_max_difference"] < 1e-5, r


@pytest.mark.parametrize("world", WORLDS)
def test_sharded_save_loads_into_one_process(groups, world):
    folder = groups["workdir"] / f"w{world}"
    saved = torch.load(folder / "saved.pt", weights_only=True)
    continued = torch.load(folder / "continued.pt", weights_only=True)
    torch.manual_seed(999)
    model = TiedNet()
    opt = make_adam("adamw", model.parameters())
    load_module_state(model, folder / "model.tlsf32")
    assert load_optimizer(opt, model, folder / "opt.tladam", restore_random_counter=True) == K
    assert differences(snapshot(model, opt), saved) == []
    assert schema_of(model).has_aliases and model.head.weight is model.emb.weight
    train(model, opt, K, N)
    after = snapshot(model, opt)
    # Bit for bit against one process continuing from the same values (same arithmetic),
    twin, twin_opt = plain_copy(saved)
    train(twin, twin_opt, K, N)
    assert differences(after, snapshot(twin, twin_opt)) == []
    # and to within rounding against the sharded run's own continuation.
    assert max_difference(after, continued) < 1e-5
    bits_model = TiedNet()
    load_state_bits(bits_model, folder / "state.json")
    state_only = {"state": saved["state"], "optimizer": {}}
    assert differences({"state": bits_model.state_dict(), "optimizer": {}}, state_only) == []


EXPECTED_ERRORS = {
    "model_truncated": "TruncatedError",
    "model_trailing": "TrailingDataError",
    "model_shape": "SchemaMismatchError",
    "model_foreign": "UnsupportedFormatError",
    "model_tie_conflict": "SchemaMismatchError",
    "model_missing": "FileNotFoundError",
    "opt_truncated": "TruncatedError",
    "opt_config_bit": "ConfigError",
    "opt_trailing": "TrailingDataError",
    "opt_version": "UnsupportedVersionError",
    "bits_truncated": "MalformedError",
    "bits_tag": "UnsupportedFormatError",
    "opt_counter_not_asked_for": "ConfigError",
}


@pytest.mark.parametrize("world", WORLDS)
def test_corrupted_files_raise_on_every_rank_and_change_nothing(groups, world):
    results = report(groups, world, "corrupted_files")
    assert set(results[0]) - {"ok"} == set(EXPECTED_ERRORS)
    for name, expected in EXPECTED_ERRORS.items():
        outcomes = [r[name] for r in results]
        assert {o["raised"] for o in outcomes} == {expected}, (name, outcomes)
        assert len({o["message"] for o in outcomes}) == 1, (name, outcomes)
        assert all(o["unchanged"] for o in outcomes), (name, outcomes)


@pytest.mark.parametrize("world", WORLDS)
def test_a_failure_on_one_rank_raises_everywhere_and_changes_nothing(groups, world):
    results = report(groups, world, "rank_local_failures")
    for name in ("injected_model", "injected_optimizer", "injected_bits"):
        outcomes = [r[name] for r in results]
        assert all(o["unchanged"] for o in outcomes), (name, outcomes)
        assert {o["raised"] for o in outcomes} == {"CheckpointError"}, (name, outcomes)
        assert all("injected: no memory for this shard" in o["message"] for o in outcomes)
    outcomes = [r["different_layout"] for r in results]
    assert {o["raised"] for o in outcomes} == {"SchemaMismatchError"}, outcomes
    assert all(o["unchanged"] for o in outcomes)


@pytest.mark.parametrize("world", WORLDS)
def test_save_failures_raise_on_every_rank(groups, world):
    results = report(groups, world, "save_failures")
    for name, expected in [
        ("missing_directory", "FileNotFoundError"),
        ("optimizer_missing_directory", "FileNotFoundError"),
        ("amsgrad", "ConfigError"),
    ]:
        outcomes = [r[name] for r in results]
        assert {o["raised"] for o in outcomes} == {expected}, (name, outcomes)
        assert len({o["message"] for o in outcomes}) == 1, (name, outcomes)
    assert results[0]["nothing_written"]


@pytest.mark.parametrize("world", WORLDS)
def test_two_param_groups_in_tlckpts_family(groups, world):
    """Hugging Face-style groups with amsgrad, FSDP2-sharded: the file is the one a single
    process writes for the full values, and a resume from it in this world is bit-exact."""
    results = report(groups, world, "own_family_groups")
    assert results[0]["identical"] == [True]
    for r in results:
        assert r["version"] == 1 and r["counter"] == K
        assert r["after_load"] == [] and r["after_training"] == []
        assert r["amsgrad"]


def test_distribute_tensor_placements_and_float64(groups):
    results = report(groups, 3, "distribute_tensor_float64")
    assert results[0]["identical"] == {"state.json": True, "opt.tladam": True}
    for r in results:
        assert r["version"] == 5
        assert r["loaded_equal"] and r["moments_equal"] and r["placements_kept"]


def test_exact_bits_of_dtypes_the_backend_does_not_carry(groups):
    """float8 and complex32 (which gloo refuses), bfloat16, complex128: the bits travel."""
    results = report(groups, 2, "exact_bits_dtypes")
    names = {"float8_e4m3fn", "bfloat16", "complex32", "complex128"}
    assert set(results[0]) - {"ok"} == names
    for name in names:
        assert results[0][name]["identical"], name
        assert all(r[name]["loaded"] for r in results), name


def test_two_dimensional_meshes(groups):
    """HSDP meshes (2x1 and 1x2), by both paths: the parallel one writes each piece from
    the first replica holding it; the streaming one gathers."""
    for r in report(groups, 2, "hsdp_meshes"):
        for shape in ("2x1", "1x2"):
            for mode in ("auto", "rank0"):
                run = r[f"{shape} {mode}"]
                assert run["placements"] == "(Replicate(), Shard(dim=0))"
                assert run["after_load"] == [] and run["after_training"] == []
                # Model and optimizer, saved and loaded: in parallel (the replicas' first
                # writes), or through rank 0 when forced.
                assert run["routes"] == ["parallel" if mode == "auto" else "rank0"] * 4


def test_rank0_memory_while_saving(groups, record_property):
    from measure_memory import report as describe

    figures = report(groups, 2, "memory")[0]
    text = describe(figures, 2)
    print("\n" + text)
    record_property("rank0_memory", text)
    one = figures["full_parameter"]
    slack = 8 << 20
    # Beyond its own shards, rank 0 holds one full parameter at a time while saving the
    # model, and m and v of one parameter while saving the optimizer.
    assert figures["model_save_peak_growth"] <= one + slack
    assert figures["optimizer_save_peak_growth"] <= 2 * one + slack


@pytest.mark.parametrize("world", [*WORLDS, *LATER])
def test_every_check_ran_and_passed_on_every_rank(groups, world, record_property):
    """Each group ran every check it was given on every rank, and each reported success
    (a check that no test reads still fails here). The group's wall time is recorded as a
    figure, not asserted: timings belong to benchmarks."""
    size, checks = LATER[world] if world in LATER else (world, CHECKS_OF_WORLD[world])
    for check in checks:
        assert len(report(groups, world, check)) == size
    record_property("seconds", round(groups["seconds"][world], 1))


#: The groups that run ``both_paths`` and ``injected_failures``, and the worlds whose files
#: each finds from the groups before it (1: the single process; 2 and 3: the groups).
PATH_GROUPS = {3: [1, 2], "2 after 3": [1, 3], "1 rank": [2, 3]}


@pytest.mark.parametrize("label", list(PATH_GROUPS))
def test_both_paths_write_single_process_bytes_and_load_exactly(groups, label):
    """Parallel (probed and forced) and streamed (forced): byte identity, exact loads, and
    resharding from every other world by both paths (3 -> 2, 1/2/3 -> 1 included)."""
    results = report(groups, label, "both_paths")
    world = len(results)
    for r in results:
        assert r["routes"] == {
            "save auto": "parallel",
            "load auto": "parallel",
            "save rank0": "rank0",
            "load rank0": "rank0",
            "save parallel": "parallel",
            "load parallel": "parallel",
        }
        assert r["identical"] == {"auto": True, "rank0": True, "parallel": True, "blind": True}
        assert all(d == [] for d in r["loaded"].values()), r["loaded"]
        expected = {
            f"{source}->{world} {mode}"
            for source in PATH_GROUPS[label]
            for mode in ("auto", "rank0")
        }
        assert set(r["foreign"]) == expected
        for name, outcome in r["foreign"].items():
            assert outcome["differences"] == [], name
            assert outcome["route"] == ("rank0" if name.endswith("rank0") else "parallel"), name
        # One rank blind to the probe: the call goes through rank 0, and says why.
        assert r["blind"] == [
            "rank0",
            "the ranks do not see the same file system",
            "rank0",
            "the ranks do not see the same file system",
        ]
        assert r["bad_setting"]["raised"] == "ConfigError"
        assert "TLCKPT_SHARDED_IO" in r["bad_setting"]["message"]
        assert r["never_written"] and r["leftovers"] == []
        reason = "a Partial placement (P(sum)) is moved through rank 0"
        assert r["partial"] == ["rank0", reason, True]
        for mode in ("auto", "rank0"):
            placed = r["placements"][mode]
            assert placed["routes"] == ["parallel" if mode == "auto" else "rank0"] * 2
            assert placed["loaded"], mode
            if r is results[0]:
                assert placed["identical"], mode
    assert len({r["bad_setting"]["message"] for r in results}) == 1


@pytest.mark.parametrize("label", list(PATH_GROUPS))
def test_a_failure_on_any_rank_at_any_phase_of_a_parallel_save_or_load(groups, label):
    results = report(groups, label, "injected_failures")
    world = len(results)
    phases = {"create", "headers", "fsync", "rename"}
    phases |= {f"pwrite rank {r}" for r in range(world)}
    phases |= {f"fsync rank {r}" for r in range(1, world)}
    assert set(results[0]["saves"]) == phases
    for phase in phases:
        outcomes = [r["saves"][phase] for r in results]
        assert {o["raised"] for o in outcomes} == {"OSError"}, (phase, outcomes)
        assert len({o["message"] for o in outcomes}) == 1, (phase, outcomes)
        assert "injected" in outcomes[0]["message"], (phase, outcomes)
        assert outcomes[0]["message"].endswith("model.tlsf32'"), outcomes  # the destination
        assert all(o["route"] == "parallel" for o in outcomes)
        assert all(o["previous_intact"] and o["leftovers"] == [] for o in outcomes), phase
    loads = {f"{what} rank {r}" for what in ("validate", "pread") for r in range(world)}
    assert set(results[0]["loads"]) == loads
    for phase in loads:
        outcomes = [r["loads"][phase] for r in results]
        assert {o["raised"] for o in outcomes} == {"OSError"}, (phase, outcomes)
        assert len({o["message"] for o in outcomes}) == 1, (phase, outcomes)
        assert all(o["unchanged"] and o["route"] == "parallel" for o in outcomes), phase


def test_checkpoint_set_of_a_sharded_model(groups):
    """Every rank saves and restores; every rank writes its own bytes of each member (the
    model member is the single-process file), rank 0 digests them and commits the manifest
    once every rank has confirmed."""
    results = report(groups, 2, "checkpoint_sets")
    assert results[0]["same_model"] is True and results[0]["world_size"] == 2
    for r in results:
        assert r["steps"] == [K]
        assert r["counter"] == K
        assert r["after_restore"] == []
        assert r["background"] == [K + 1]
        assert r["route"] == "parallel"
        refused = r["structured"]
        assert "sharded (DTensor) model" in refused["sequence"], refused
        assert refused["sequence_steps"] == []
        assert refused["safetensors"] == "accepted", refused
        assert refused["safetensors_steps"] == [K]
        assert refused["safetensors_restored"] == []


def test_signed_checkpoint_set_of_a_sharded_model(groups):
    """A sharded save with a key signs the set (rank 0's digesting writers see every byte);
    without the key every rank refuses it and nothing changes; with it the restore is exact."""
    results = report(groups, 2, "signed_checkpoint_sets")
    assert results[0]["signed"] is True
    for r in results:
        assert r["keyless"] == "KeyRequiredError" and r["unchanged"]
        assert r["counter"] == K and r["after_restore"] == []

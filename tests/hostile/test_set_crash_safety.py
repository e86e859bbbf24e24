"""Crash safety of checkpoint sets: the short CI versions of ``python -m fuzz.set_crash_kill``
(and of its ``--exit-background`` mode).

A child saving checkpoint sets (blocking and in the background) is killed with SIGKILL at
random moments: every committed set still verifies, ``latest()`` is the newest and restores
exactly the values its child announced, no set committed earlier is lost (beyond retention),
and leftovers stay bounded and are removed by the next completed save.
"""

from __future__ import annotations

from pathlib import Path

from hostile_support import last_json, run_campaign


def _campaign(tmp_path: Path, *flags: str, trials: int, timeout: int) -> dict:
    """Run ``fuzz.set_crash_kill`` with ``flags``; its report, once what every campaign
    must show is checked (no problem, few leftovers, a clean exit)."""
    args = ["fuzz.set_crash_kill", *flags, "--trials", str(trials), "--size-mb", "2"]
    proc = run_campaign([*args, "--quiet", "--dir", str(tmp_path)], timeout=timeout)
    report = last_json(proc.stdout)
    assert report, proc.stdout + proc.stderr[-3000:]
    assert report["problems"] == [], report
    assert report["max_leftovers"] <= 2, report
    assert proc.returncode == 0, proc.stdout
    return report


def test_sigkill_during_set_saves_never_damages_or_loses_a_set(tmp_path: Path) -> None:
    """8 trials, and more (up to 24) while fewer than 2 kills landed mid-save: on a busy
    machine the calibration saves can aim every kill past the end of the save."""
    report = _campaign(tmp_path, "--min-killed", "2", trials=8, timeout=400)
    assert report["trials_killed"] >= 2, report
    assert report["restores_checked"] == 10 + report["extra_trials"], report


def test_background_saves_ended_by_process_exit_commit_or_say_so(tmp_path: Path) -> None:
    """``--exit-background``: each child starts a background save and ends (script end,
    ``sys.exit``, an exception, ``KeyboardInterrupt``, SIGINT, ``os._exit``, SIGKILL; some
    under a file size limit): its set is committed and verifies, or stderr says why not."""
    report = _campaign(tmp_path, "--exit-background", trials=10, timeout=400)
    assert sum(report["outcomes"].values()) == 11, report  # and the calibration trial
    endings = {outcome.split(":")[0] for outcome in report["outcomes"]}
    assert len(endings) >= 4, report
    assert report["restores_checked"] >= 1, report

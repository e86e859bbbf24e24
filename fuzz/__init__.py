"""Hostile-input and crash-safety campaigns for tlckpt (not part of the installed package).

Each campaign is one command run from the repository root; see ``fuzz/README.md``:

* ``python -m fuzz.mutate``        — systematic + random mutation campaign, time/memory bounds;
* ``python -m fuzz.atheris_run``   — coverage-guided fuzzing, one atheris target per reader;
* ``python -m fuzz.runtime_hostile`` — mutated files into live modules/optimizers;
* ``python -m fuzz.crash_kill``    — SIGKILL during large saves (one trial: ``fuzz.kill_trial``);
* ``python -m fuzz.concurrent_save`` — two processes saving to one path;
* ``python -m fuzz.load_interrupts`` — SIGINT at random moments of loads;
* ``python -m fuzz.load_races``      — loads racing a process that rewrites the file in place.

Nothing here imports ``tlckpt`` at package import time, so the atheris runner can instrument
the library before it is first imported.
"""

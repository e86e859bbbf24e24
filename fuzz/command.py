"""What every campaign's command line shares: its parser, its working folder, its report.

Each campaign is ``python -m fuzz.<name>``: its module docstring is its ``--help``; the
campaigns that work in a folder take ``--dir`` (the parent of a temporary working folder,
removed at the end) and ``--quiet``; their report is one JSON object printed with one key a
line (``tests/hostile`` reads it back), with the campaign's wall time in ``seconds``; the
exit status is 0 when nothing was found, else 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["campaign_parser", "add_folder_options", "run_in_folder", "exit_with"]


def campaign_parser(name: str, doc: str | None, seed: int | None = None) -> argparse.ArgumentParser:
    """The parser of ``python -m fuzz.<name>``, its help the module docstring ``doc``.

    Args:
        name: the campaign's module name.
        doc: its docstring, shown by ``--help``.
        seed: if given, the default of a ``--seed`` option (the campaign's random seed, so
            that a run can be repeated).

    Returns:
        The parser, for the campaign to add its own options.
    """
    parser = argparse.ArgumentParser(
        prog=f"python -m fuzz.{name}",
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    if seed is not None:
        parser.add_argument(
            "--seed", type=int, default=seed, help="random seed (default: %(default)s)"
        )
    return parser


def add_folder_options(parser: argparse.ArgumentParser, quiet: bool = True) -> None:
    """``--dir`` (where the temporary working folder goes) and, if ``quiet``, ``--quiet``."""
    parser.add_argument(
        "--dir",
        default=None,
        help="where the temporary working folder goes (default: the system's)",
    )
    if quiet:
        parser.add_argument("--quiet", action="store_true")


def run_in_folder(
    prefix: str, parent: str | None, campaign: Callable[[Path], dict[str, Any]]
) -> dict[str, Any]:
    """Run ``campaign`` in a fresh temporary folder under ``parent`` (removed after), add its
    wall time to its report as ``seconds``, print the report as JSON and return it."""
    with tempfile.TemporaryDirectory(prefix=prefix, dir=parent) as tmp:
        start = time.monotonic()
        report = campaign(Path(tmp))
        report["seconds"] = round(time.monotonic() - start, 1)
    print(json.dumps(report, indent=1))
    return report


def exit_with(main: Callable[[], int]) -> None:
    """Run a campaign's ``main`` as the program, one math thread per process (the campaigns
    start several processes on a small machine), and exit with its status."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())

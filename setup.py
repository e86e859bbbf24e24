"""Package discovery for the wheel (everything else is declared in ``pyproject.toml``).

The repository root is the package ``tlckpt`` (``package_dir={"tlckpt": "."}``), which
pyproject.toml's static ``packages`` list cannot discover: a hand-written list once left
``tlckpt.runtime.collectives`` out of every wheel. Here every folder with an ``__init__.py``
below the root, at any depth, is a subpackage of ``tlckpt``, except the development-only
trees (:data:`DEVELOPMENT_ONLY`), which nothing in the library imports.
``tests/test_package.py`` checks the result against the folders on disk.
"""

from __future__ import annotations

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

#: Top-level folders that are not shipped: the test suite, the fuzzing and crash campaigns,
#: the benchmarks and the documentation (and build outputs, should they hold packages).
DEVELOPMENT_ONLY = ("tests", "fuzz", "bench", "docs", "build", "dist")


def subpackages(where: str = ".") -> list[str]:
    """Every package under ``where`` (the repository root), as ``tlckpt.<dotted path>``.

    Args:
        where: the repository root.

    Returns:
        ``"tlckpt"`` first, then its subpackages at any depth, sorted.
    """
    exclude = [pattern for top in DEVELOPMENT_ONLY for pattern in (top, f"{top}.*")]
    found = find_packages(where=where, exclude=exclude)
    return ["tlckpt", *sorted(f"tlckpt.{name}" for name in found)]


class BuildPy(build_py):
    """``build_py`` without this script: it lies in the root package's folder, but it is the
    build's, not a module of ``tlckpt``."""

    def find_package_modules(self, package: str, package_dir: str) -> list[tuple[str, str, str]]:
        modules = super().find_package_modules(package, package_dir)
        if package != "tlckpt":
            return modules
        return [entry for entry in modules if entry[1] != "setup"]


if __name__ == "__main__":
    setup(packages=subpackages(), package_dir={"tlckpt": "."}, cmdclass={"build_py": BuildPy})

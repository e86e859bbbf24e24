#!/usr/bin/env bash
# CI, after `make test`: check what users install, not the editable checkout.
#
# Builds the wheel from a copy of the checkout's files (tracked and untracked, not ignored:
# what a fresh clone holds), installs it into fresh virtual environments outside the
# checkout, and from there runs .ci/wheel_smoke.py and the numpy-only tests against the
# installed copy:
#   * Python 3.11 with tlckpt[torch,cli] (torch 2.13.0's CPU build from /opt/wheels, never a
#     CUDA one) and the test helpers' packages: every module imports; first use with torch.
#   * Python 3.10 and 3.13, the oldest and newest that pyproject.toml claims (no torch wheel
#     for them here): the core dependencies only; every module imports or fails as
#     documented; first use of the codec and the command line; the set 3.11 wrote verifies.
# Interpreters: $TLCKPT_PYTHON_3_10
# (…_3_11, …_3_13), else pyenv's, else python3.X on PATH. Exits non-zero on any failure.
set -euo pipefail

checkout="$(cd "$(dirname "$0")/.." && pwd)"
scratch="$(mktemp -d "${TMPDIR:-/tmp}/tlckpt-wheel.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT
started=$SECONDS

# The numpy-only tests, run against the installed copy (a copy of tests/, not the checkout).
NUMPY_TESTS=(
    tests/codec/test_vectors.py
    tests/codec/test_api.py
    tests/formats/test_specs.py
    tests/cli/test_inspect.py
    tests/cli/test_without_torch.py
)
# Of those, the ones that need torch installed (they hide it from a child process, or write
# a set with it): left out where there is none.
TORCH_TESTS=(
    tests/cli/test_without_torch.py::test_convert_to_safetensors_says_what_to_install
    tests/cli/test_without_torch.py::test_checkpoint_sets_are_listed_and_verified_without_torch
)

say() { printf '\n== %s (%ds)\n' "$*" "$((SECONDS - started))"; }

find_python() {  # find_python 3.10 -> an interpreter of that version
    local version="$1" var="TLCKPT_PYTHON_${1//./_}" candidate
    local candidates=("${!var:-}")
    if command -v pyenv >/dev/null; then
        candidates+=("$(pyenv root)"/versions/"$version".*/bin/python)
    fi
    candidates+=("python$version")
    for candidate in "${candidates[@]}"; do
        [[ -n "$candidate" ]] || continue
        if "$candidate" -c "import sys; sys.exit(sys.version_info[:2] != tuple(map(int, '$version'.split('.'))))" 2>/dev/null; then
            echo "$candidate"
            return
        fi
    done
    echo "no Python $version found (set $var)" >&2
    return 1
}

# A fresh environment at $scratch/venv-VERSION with the given requirements.
make_env() {
    local version="$1" python venv="$scratch/venv-$1"
    shift
    python="$(find_python "$version")"
    "$python" -m venv "$venv"
    # pip's notes on index locations that lack a package are left out (one per package).
    "$venv/bin/python" -m pip install -q --find-links /opt/wheels "$@" \
        2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}

# Run the smoke and the numpy-only tests with the environment's Python, from $scratch/run.
# check_env VERSION [--no-torch]
check_env() {
    local version="$1" venv="$scratch/venv-$1" deselect=()
    shift
    if [[ "${1:-}" == --no-torch ]]; then
        deselect=("${TORCH_TESTS[@]/#/--deselect=}")
    fi
    rm -rf "$scratch/run" && mkdir -p "$scratch/run/work"
    cp -r "$checkout/tests" "$scratch/run/tests"
    (
        cd "$scratch/run"
        unset PYTHONPATH
        "$venv/bin/python" "$checkout/.ci/wheel_smoke.py" --checkout "$checkout" \
            --work "$scratch/run/work" --set-dir "$scratch/sets" "$@"
        # The tests' helpers (cli_support, conftest) are in the copy; tlckpt is the
        # installed one; the vectors are the copy's (tlckpt.testing looks beside the package).
        TLCKPT_VECTORS="$scratch/run/tests/vectors" "$venv/bin/python" -m pytest -q \
            -p no:cacheprovider --import-mode=importlib --rootdir . \
            "${deselect[@]}" "${NUMPY_TESTS[@]}"
    )
}

say "building the wheel"
mkdir "$scratch/src"
(cd "$checkout" && git ls-files -z --cached --others --exclude-standard) |
    while IFS= read -r -d '' file; do  # a tracked file deleted in the checkout is left out
        [[ -e "$checkout/$file" ]] && printf '%s\0' "$file"
    done | (cd "$checkout" && xargs -0 cp --parents -t "$scratch/src")
"$(find_python 3.11)" -m pip wheel -q --no-deps -w "$scratch/dist" "$scratch/src"
wheel=("$scratch"/dist/tlckpt-*.whl)
echo "${wheel[0]##*/}"

# 3.11: the pinned versions of requirements-dev.txt (as constraints). torch is pinned there
# to 2.13.0, whose CPU build lies in /opt/wheels (its local version, +cpu, is preferred);
# the smoke refuses a CUDA build. hypothesis and transformers: tlckpt.testing's helpers.
say "Python 3.11 with torch"
# pip takes no extras in a constraint (moto[server,s3]): the pins without them.
sed -e 's/\[[^]]*\]//' "$checkout/requirements-dev.txt" > "$scratch/constraints.txt"
make_env 3.11 -c "$scratch/constraints.txt" "${wheel[0]}[torch,cli,remote]" \
    hypothesis transformers pytest
check_env 3.11

# 3.10 and 3.13: what pip resolves from pyproject.toml's ranges, as a user's install does
# (requirements-dev.txt's pins are for 3.11: numpy 2.4 needs Python >= 3.11).
for version in 3.10 3.13; do
    say "Python $version without torch"
    make_env "$version" "${wheel[0]}" pytest
    check_env "$version" --no-torch
done

say "the installed wheel works on Python 3.10, 3.11 and 3.13"

"""``open_checkpoint`` reads only what describes the tensors until one is asked for (issue #21:
a 256 MiB file read ≤ 1 MiB at open): bytes read counted by the kernel (``rchar`` of
``/proc/self/io``), for the safetensors layout and ``TLSF32B``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import tlckpt

MIB = 1 << 20
pytestmark = pytest.mark.skipif(
    not Path("/proc/self/io").exists(), reason="needs /proc/self/io (Linux)"
)


def _rchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def _read_while(fn) -> tuple[object, int]:
    before = _rchar()
    result = fn()
    return result, _rchar() - before


def _describe(path: Path) -> tuple[object, list]:
    f = tlckpt.open_checkpoint(path)
    return f, [(n, f.shape(n), f.dtype(n)) for n in f.names()]


@pytest.mark.parametrize("suffix", [".safetensors", ".tlsf32"])
def test_opening_reads_only_the_description(tmp_path: Path, suffix: str) -> None:
    count, per = 64, MIB // 2  # 32 MiB of float32 in 64 tensors
    tensors = {f"layer.{i}": torch.full((per // 4,), float(i)) for i in range(count)}
    path = tmp_path / f"big{suffix}"
    tlckpt.save_module_state(tensors, path)
    small = tmp_path / f"small{suffix}"
    tlckpt.save_module_state({"w": torch.ones(2)}, small)
    with _describe(small)[0] as f:  # first calls import modules: their reads are not the file's
        f.tensor(f.names()[0])
    (f, described), opened = _read_while(lambda: _describe(path))
    with f:
        assert len(described) == count
        assert opened <= MIB, f"{opened} bytes read to open a {path.stat().st_size}-byte file"
        name = "layer.37" if suffix == ".safetensors" else "37"  # TLSF32B: positions
        tensor, read = _read_while(lambda: f.tensor(name))
        assert torch.equal(tensor, tensors["layer.37"])
        assert per <= read <= per + MIB  # that tensor's bytes, not the file's

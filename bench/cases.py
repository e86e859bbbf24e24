"""The benchmark cases: one library on one workload, and the operations timed for it.

A case is a class: ``setup`` builds the live state (untimed), ``ops`` lists the timed
operations, ``verify`` proves after the timings that a load really lands the saved values in
the live state. Libraries are imported inside ``setup`` so that the worker can time their
import separately (it imports them first, measured, and ``setup`` finds them cached).

Fairness rules, the same for every library:

* the file is removed before every save (untimed), so each save writes a fresh file and no
  one pays for truncating the previous one;
* "save" is durable: tlckpt fsyncs the file and its folder itself, the baselines get the same
  ``fsync`` (file, then folder) inside the timed section; "save_nofsync" skips it (tlckpt
  through the file-object form of its API, which writes in place with no fsync);
* "load" into a live model: tlckpt loads into the module in place; torch and safetensors load
  a state dict and then ``model.load_state_dict`` it (what ``safetensors.torch.load_model``
  does), with the load alone reported as the ``read`` split; raw ``readinto``\\ s into the
  live tensors' memory;
* loads run from a warm page cache (the file was just written); "load_cold" first drops the
  file's pages with ``posix_fadvise(POSIX_FADV_DONTNEED)``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from bench.workloads import Size, StateModel, adam_state, bits_values, state_model

__all__ = ["CASES", "Case", "Op", "case_names"]

Splits = dict[str, float] | None


@dataclass(frozen=True)
class Op:
    """One timed operation: ``prepare`` runs untimed before each repetition."""

    name: str
    run: Callable[[], Splits]
    prepare: Callable[[], dict | None] | None = None


def _fsync_dir(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_path(path: str) -> None:
    """What a durable save does after writing: fsync the file, then its folder."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    _fsync_dir(os.path.dirname(path))


def _unlink(path: str) -> None:
    if os.path.exists(path):
        os.unlink(path)


def _resident_bytes(path: str) -> int | None:
    """Bytes of ``path`` in the page cache (``fincore``), or None where it is unavailable."""
    tool = shutil.which("fincore")
    if tool is None:
        return None
    out = subprocess.run(
        [tool, "--bytes", "--noheadings", "--output", "RES", path],
        capture_output=True,
        text=True,
        check=False,
    )
    try:
        return int(out.stdout.split()[0])
    except (IndexError, ValueError):
        return None


def _drop_cache(path: str) -> dict:
    """Evict the (clean, fsynced) file from the page cache; report what is left resident."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return {"resident_bytes": _resident_bytes(path)}


def _byte_view(t: torch.Tensor) -> memoryview:
    """The raw bytes of a contiguous CPU tensor (a view: writing into it writes the tensor)."""
    return memoryview(t.detach().numpy()).cast("B")


def _checksums(tensors: list[torch.Tensor]) -> list[int]:
    """A CRC-32 of each tensor's bytes: exact, and fast enough for gigabytes."""
    return [zlib.crc32(_byte_view(t.contiguous())) for t in tensors]


class Case:
    """A library on a workload. Subclasses set ``workload``, ``library``, ``imports``."""

    workload = ""
    library = ""
    #: modules whose import the worker times (after numpy and torch, each on top of the last);
    #: ``tlckpt`` imports its runtime lazily, so runtime cases name ``tlckpt.runtime`` too
    imports: tuple[str, ...] = ()
    #: file name suffix of the checkpoint
    suffix = ".bin"

    def __init__(self, size: Size, folder: str):
        self.size = size
        self.folder = folder
        self.path = os.path.join(folder, f"{self.workload}-{self.library}{self.suffix}")
        self.payload_bytes = 0
        self.tensor_count = 0

    def setup(self) -> None:
        raise NotImplementedError

    def ops(self) -> list[Op]:
        raise NotImplementedError

    def verify(self) -> bool:
        raise NotImplementedError

    def file_bytes(self) -> int:
        return os.path.getsize(self.path) if os.path.exists(self.path) else 0

    def cleanup(self) -> None:
        _unlink(self.path)


# --------------------------------------------------------------------------- W1 / W2


class _StateCase(Case):
    """Model state: ``write(durable)`` and ``read()`` per library; ops are shared."""

    cold = False

    def _model(self) -> StateModel:
        raise NotImplementedError

    def setup(self) -> None:
        self.model = self._model()
        self.params = list(self.model.parameters())
        self.payload_bytes = sum(p.numel() * 4 for p in self.params)
        self.tensor_count = len(self.params)
        self.reference = _checksums(self.params)

    def write(self, durable: bool) -> Splits:
        raise NotImplementedError

    def read(self) -> Splits:
        raise NotImplementedError

    def ops(self) -> list[Op]:
        def fresh() -> None:
            _unlink(self.path)

        ops = [
            Op("save_nofsync", lambda: self.write(False), fresh),
            Op("save", lambda: self.write(True), fresh),
            Op("load", self.read),
        ]
        if self.cold:
            ops.append(Op("load_cold", self.read, lambda: _drop_cache(self.path)))
        return ops

    def verify(self) -> bool:
        with torch.no_grad():
            for p in self.params:
                p.zero_()
        self.read()
        return _checksums(self.params) == self.reference


class _W1:
    workload = "W1"
    cold = True

    def _model(self) -> StateModel:
        return state_model(self.size.w1_count, self.size.w1_shape)


class _W2:
    workload = "W2"

    def _model(self) -> StateModel:
        return state_model(self.size.w2_count, self.size.w2_shape)


class _TlckptState(_StateCase):
    library = "tlckpt"
    imports = ("tlckpt", "tlckpt.runtime")
    suffix = ".tlsf32"

    def write(self, durable: bool) -> Splits:
        import tlckpt

        if durable:
            tlckpt.save_module_state(self.model, self.path)
        else:
            with open(self.path, "wb") as f:
                tlckpt.save_module_state(self.model, f)
        return None

    def read(self) -> Splits:
        import tlckpt

        tlckpt.load_module_state(self.model, self.path)
        return None


class _TorchState(_StateCase):
    library = "torch"
    suffix = ".pt"

    def write(self, durable: bool) -> Splits:
        torch.save(self.model.state_dict(), self.path)
        if durable:
            _fsync_path(self.path)
        return None

    def read(self) -> Splits:
        t0 = time.perf_counter()
        state = torch.load(self.path, weights_only=True)
        read = time.perf_counter() - t0
        self.model.load_state_dict(state)
        return {"read": read}


class _SafetensorsState(_StateCase):
    library = "safetensors"
    imports = ("safetensors.torch",)
    suffix = ".safetensors"

    def write(self, durable: bool) -> Splits:
        from safetensors.torch import save_file

        save_file(self.model.state_dict(), self.path)
        if durable:
            _fsync_path(self.path)
        return None

    def read(self) -> Splits:
        from safetensors.torch import load_file

        t0 = time.perf_counter()
        state = load_file(self.path)
        read = time.perf_counter() - t0
        self.model.load_state_dict(state)
        return {"read": read}


class _RawState(_StateCase):
    """The I/O limit: the payload bytes alone, ``write(memoryview)`` and ``readinto``."""

    library = "raw"

    def setup(self) -> None:
        super().setup()
        self.views = [_byte_view(p) for p in self.params]

    def write(self, durable: bool) -> Splits:
        with open(self.path, "wb") as f:
            for view in self.views:
                f.write(view)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        if durable:
            _fsync_dir(self.folder)
        return None

    def read(self) -> Splits:
        with open(self.path, "rb") as f:
            for view in self.views:
                if f.readinto(view) != len(view):
                    raise EOFError(self.path)
        return None


# --------------------------------------------------------------------------- W3


class _AdamCase(Case):
    workload = "W3"

    def setup(self) -> None:
        self.model, self.opt = adam_state(self.size)
        self.params = list(self.model.parameters())
        self.payload_bytes = sum(2 * p.numel() * 4 for p in self.params)
        self.tensor_count = 2 * len(self.params)
        self.reference = _checksums(self._moments())

    def _moments(self) -> list[torch.Tensor]:
        out = []
        for p in self.params:
            state = self.opt.state[p]
            out += [state["exp_avg"], state["exp_avg_sq"]]
        return out

    def write(self, durable: bool) -> Splits:
        raise NotImplementedError

    def read(self) -> Splits:
        raise NotImplementedError

    def ops(self) -> list[Op]:
        def fresh() -> None:
            _unlink(self.path)

        return [
            Op("save_nofsync", lambda: self.write(False), fresh),
            Op("save", lambda: self.write(True), fresh),
            Op("load", self.read),
        ]

    def verify(self) -> bool:
        with torch.no_grad():
            for t in self._moments():
                t.zero_()
        self.read()
        return _checksums(self._moments()) == self.reference


class _TlckptAdam(_AdamCase):
    library = "tlckpt"
    imports = ("tlckpt", "tlckpt.runtime")
    suffix = ".tladam"

    def write(self, durable: bool) -> Splits:
        import tlckpt

        if durable:
            tlckpt.save_optimizer(self.opt, self.model, self.path)
        else:
            with open(self.path, "wb") as f:
                tlckpt.save_optimizer(self.opt, self.model, f)
        return None

    def read(self) -> Splits:
        import tlckpt

        tlckpt.load_optimizer(self.opt, self.model, self.path)
        return None


class _TorchAdam(_AdamCase):
    library = "torch"
    suffix = ".pt"

    def write(self, durable: bool) -> Splits:
        torch.save(self.opt.state_dict(), self.path)
        if durable:
            _fsync_path(self.path)
        return None

    def read(self) -> Splits:
        t0 = time.perf_counter()
        state = torch.load(self.path, weights_only=True)
        read = time.perf_counter() - t0
        self.opt.load_state_dict(state)
        return {"read": read}


class _RawAdam(_AdamCase):
    """The moments' bytes alone. ``load`` reads into freshly allocated tensors and then swaps
    them into the optimizer's state (freeing the old ones), the least a plan-then-commit load
    must do; ``load_inplace`` reads into the live moments, the absolute floor."""

    library = "raw"

    def _views(self) -> list[memoryview]:
        return [_byte_view(t) for t in self._moments()]

    def write(self, durable: bool) -> Splits:
        with open(self.path, "wb") as f:
            for view in self._views():
                f.write(view)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        if durable:
            _fsync_dir(self.folder)
        return None

    def read(self) -> Splits:
        fresh = []
        with open(self.path, "rb") as f:
            for p in self.params:
                pair = []
                for _ in range(2):
                    t = torch.empty_like(p, requires_grad=False)
                    view = _byte_view(t)
                    if f.readinto(view) != len(view):
                        raise EOFError(self.path)
                    pair.append(t)
                fresh.append(pair)
        for p, (m, v) in zip(self.params, fresh):
            state = self.opt.state[p]
            state["exp_avg"], state["exp_avg_sq"] = m, v
        return None

    def read_inplace(self) -> Splits:
        with open(self.path, "rb") as f:
            for view in self._views():
                if f.readinto(view) != len(view):
                    raise EOFError(self.path)
        return None

    def ops(self) -> list[Op]:
        return [*super().ops(), Op("load_inplace", self.read_inplace)]

    def verify(self) -> bool:
        ok = super().verify()
        with torch.no_grad():
            for t in self._moments():
                t.zero_()
        self.read_inplace()
        return ok and _checksums(self._moments()) == self.reference


# --------------------------------------------------------------------------- W4

_TAG = "torchlean_state_float32_bits_v1"


class _BitsCase(Case):
    """Exact-bits JSON of W4's words: array → durable file → array."""

    workload = "W4"
    suffix = ".json"

    def setup(self) -> None:
        self.values = bits_values(self.size)
        self.array = self.values.numpy()
        self.shape = tuple(self.array.shape)
        self.payload_bytes = self.array.nbytes
        self.tensor_count = 1
        self.result: np.ndarray | None = None

    def write(self) -> Splits:
        raise NotImplementedError

    def read(self) -> Splits:
        raise NotImplementedError

    def ops(self) -> list[Op]:
        def fresh() -> None:
            _unlink(self.path)

        def forget() -> None:
            self.result = None

        return [Op("save", self.write, fresh), Op("load", self.read, forget)]

    def verify(self) -> bool:
        self.result = None
        self.read()
        got = self.result
        self.result = None
        return got is not None and np.array_equal(
            np.asarray(got).view(np.uint32), self.array.view(np.uint32)
        )

    def _doc(self, words: object) -> dict:
        return {"format": _TAG, "state": [{"shape": list(self.shape), "values": words}]}

    def _write_bytes(self, data: bytes) -> None:
        with open(self.path, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(self.folder)


class _TlckptBits(_BitsCase):
    """The codec: ``write_state_bits`` / ``read_state_bits`` on numpy arrays."""

    library = "tlckpt"
    imports = ("tlckpt",)

    def write(self) -> Splits:
        from tlckpt.codec import write_state_bits

        write_state_bits(self.path, [self.array], "float32", pretty=False)
        return None

    def read(self) -> Splits:
        from tlckpt.codec import read_state_bits

        self.result = read_state_bits(self.path, [self.shape], "float32")[0]
        return None


class _TlckptBitsModule(_BitsCase):
    """The runtime: ``save_state_bits`` / ``load_state_bits`` on a module, in place."""

    library = "tlckpt-module"
    imports = ("tlckpt", "tlckpt.runtime")

    def setup(self) -> None:
        super().setup()
        self.model = StateModel([self.values.clone()])

    def write(self) -> Splits:
        import tlckpt

        tlckpt.save_state_bits(self.model, self.path, pretty=False)
        return None

    def read(self) -> Splits:
        import tlckpt

        tlckpt.load_state_bits(self.model, self.path)
        self.result = self.model.params[0].detach().numpy()
        return None

    def verify(self) -> bool:
        with torch.no_grad():
            self.model.params[0].zero_()
        return super().verify()


class _JsonBits(_BitsCase):
    """The standard library on the same words: ``tolist`` → ``json.dumps`` → file, and
    file → ``json.loads`` → ``np.array``. Splits: the ``dumps`` / ``loads`` calls alone."""

    library = "json"
    imports = ("json",)

    def write(self) -> Splits:
        words = self.array.view(np.uint32).ravel().tolist()
        t0 = time.perf_counter()
        text = json.dumps(self._doc(words), separators=(",", ":"))
        dumps = time.perf_counter() - t0
        self._write_bytes(text.encode("ascii"))
        return {"dumps": dumps}

    def read(self) -> Splits:
        with open(self.path, "rb") as f:
            data = f.read()
        t0 = time.perf_counter()
        doc = json.loads(data)
        loads = time.perf_counter() - t0
        tensor = doc["state"][0]
        words = np.array(tensor["values"], dtype=np.uint32)
        self.result = words.view(np.float32).reshape(tensor["shape"])
        return {"loads": loads}


class _OrjsonBits(_BitsCase):
    """orjson with its numpy support, as a fast plain-JSON reference (no validation)."""

    library = "orjson"
    imports = ("orjson",)

    def write(self) -> Splits:
        import orjson

        words = self.array.view(np.uint32).reshape(-1)
        t0 = time.perf_counter()
        data = orjson.dumps(self._doc(words), option=orjson.OPT_SERIALIZE_NUMPY)
        dumps = time.perf_counter() - t0
        self._write_bytes(data)
        return {"dumps": dumps}

    def read(self) -> Splits:
        import orjson

        with open(self.path, "rb") as f:
            data = f.read()
        t0 = time.perf_counter()
        doc = orjson.loads(data)
        loads = time.perf_counter() - t0
        tensor = doc["state"][0]
        words = np.array(tensor["values"], dtype=np.uint32)
        self.result = words.view(np.float32).reshape(tensor["shape"])
        return {"loads": loads}


# --------------------------------------------------------------------------- registry


def _on(workload: type, library: type) -> type:
    return type(f"{workload.__name__}{library.__name__}", (workload, library), {})


#: Case name (``<workload>-<library>``) → class, in the order the suite runs them.
CASES: dict[str, type[Case]] = {
    f"{c.workload}-{c.library}": c
    for c in [
        _on(_W1, _TlckptState),
        _on(_W1, _TorchState),
        _on(_W1, _SafetensorsState),
        _on(_W1, _RawState),
        _on(_W2, _TlckptState),
        _on(_W2, _TorchState),
        _on(_W2, _SafetensorsState),
        _on(_W2, _RawState),
        _TlckptAdam,
        _TorchAdam,
        _RawAdam,
        _TlckptBits,
        _TlckptBitsModule,
        _JsonBits,
        _OrjsonBits,
    ]
}


def case_names() -> list[str]:
    """Every case, in suite order."""
    return list(CASES)

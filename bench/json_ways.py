"""Exact-bits JSON of one float32 tensor: tlckpt against the standard library and orjson.

* ``tlckpt`` — the codec: ``write_state_bits(path, [array], "float32", pretty=False)`` /
  ``read_state_bits(path, shapes, "float32")``;
* ``tlckpt module`` — the runtime: ``save_state_bits`` / ``load_state_bits`` on a module;
* ``json`` — ``tolist`` → ``json.dumps`` → durable file, and file → ``json.loads`` →
  ``np.array`` (the same words, without tlckpt's checks);
* ``orjson`` — the same with orjson's numpy support.

Every save is durable (fsync of the file and its folder).
"""

from __future__ import annotations

import json
import os

import numpy as np
import torch

from bench.measure import Way, fsync_path
from bench.models import StateModel

__all__ = ["json_ways"]

_TAG = "torchlean_state_float32_bits_v1"


def json_ways(values: torch.Tensor, folder: str) -> tuple[dict[str, Way], dict[str, Way], dict]:
    """``(save ways, load ways, results)``: each load stores its array in ``results``."""
    import orjson

    import tlckpt
    from tlckpt.codec import read_state_bits, write_state_bits

    array = values.numpy()
    shape = tuple(array.shape)
    words = array.view(np.uint32).reshape(-1)
    model = StateModel([values.clone()])
    paths = {k: os.path.join(folder, f"{k}.json") for k in ("codec", "module", "json", "orjson")}
    results: dict = {}

    def doc(w: object) -> dict:
        return {"format": _TAG, "state": [{"shape": list(shape), "values": w}]}

    def durable(path: str, data: bytes) -> None:
        with open(path, "wb") as f:
            f.write(data)
        fsync_path(path)

    def parsed(name: str, document: dict) -> None:
        tensor = document["state"][0]
        got = np.array(tensor["values"], dtype=np.uint32)
        results[name] = got.view(np.float32).reshape(tensor["shape"])

    def unlink(path: str) -> Way:
        return lambda: os.path.exists(path) and os.unlink(path)  # type: ignore[return-value]

    saves = {
        "tlckpt": Way(
            lambda: write_state_bits(paths["codec"], [array], "float32", pretty=False),
            unlink(paths["codec"]),
        ),
        "tlckpt module": Way(
            lambda: tlckpt.save_state_bits(model, paths["module"], pretty=False),
            unlink(paths["module"]),
        ),
        "json": Way(
            lambda: durable(
                paths["json"],
                json.dumps(doc(words.tolist()), separators=(",", ":")).encode("ascii"),
            ),
            unlink(paths["json"]),
        ),
        "orjson": Way(
            lambda: durable(
                paths["orjson"], orjson.dumps(doc(words), option=orjson.OPT_SERIALIZE_NUMPY)
            ),
            unlink(paths["orjson"]),
        ),
    }

    def module_load() -> None:
        tlckpt.load_state_bits(model, paths["module"])
        results["tlckpt module"] = model.params[0].detach().numpy()

    def read(path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    loads = {
        "tlckpt": Way(
            lambda: results.__setitem__(
                "tlckpt", read_state_bits(paths["codec"], [shape], "float32")[0]
            )
        ),
        "tlckpt module": Way(module_load),
        "json": Way(lambda: parsed("json", json.loads(read(paths["json"])))),
        "orjson": Way(lambda: parsed("orjson", orjson.loads(read(paths["orjson"])))),
    }
    return saves, loads, results

"""The JSON node replacement of the mutation campaign gives the documents it describes.

``json_set`` specs are applied from a cached template per seed and path (the document with a
marker where the node was); whichever order specs come in, the result must be the document
with that node replaced, serialised compactly.
"""

from __future__ import annotations

import json
import random
from typing import Any

from hostile_support import fuzz_module

mutators = fuzz_module("mutators")
seeds_mod = fuzz_module("seeds")


def _reference(data: bytes, path: tuple, raw: bytes) -> bytes:
    if not path:
        return raw
    doc: Any = json.loads(data)
    node = doc
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = "\u0001marker\u0001"
    text = json.dumps(doc, separators=(",", ":")).encode()
    return text.replace(json.dumps("\u0001marker\u0001").encode(), raw, 1)


def test_json_set_matches_a_fresh_serialisation_in_any_order() -> None:
    seeds = [s for s in seeds_mod.vector_seeds() if s.kind == "state_bits" and s.valid][:3]
    assert seeds
    specs = [
        (seed, spec)
        for seed in seeds
        for spec in mutators.systematic(seed.data, False)
        if spec[0] == "json_set"
    ]
    random.Random(3).shuffle(specs)  # paths and seeds interleaved: the cache must follow
    cache: dict = {}
    for seed, spec in specs[:3000]:
        _, path, raw = spec
        assert mutators.apply(seed.data, spec, cache) == _reference(seed.data, path, raw), spec
    # A key the node lacks is added, and the seed's own document is left as it was.
    (seed, _), *_ = specs
    added = mutators.apply(seed.data, ("json_set", ("extra",), b"[1]"), cache)
    assert json.loads(added)["extra"] == [1]
    assert mutators.apply(seed.data, ("json_set", ("format",), b'"x"'), cache) == _reference(
        seed.data, ("format",), b'"x"'
    )

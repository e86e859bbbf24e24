"""The optimizer-tree family in the family registry: told from its first bytes (a safetensors
header whose metadata starts with the document, :data:`~tlckpt.formats.optimizer_tree.HEAD`),
described by ``inspect``, checked against a destination (the optimizer class, its groups'
parameter names, dtypes and shapes, and the file's tensors), fuzzed from its examples.

Registered (:mod:`..registrations`) before the plain safetensors family, whose sniff also
accepts these files.
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...formats.optimizer_tree import FAMILY, HEAD, VERSION
from ...formats.primitives import unpack_u64
from ...formats.safetensors import HEADER_LENGTH_SIZE
from ..errors import SchemaMismatchError
from ..families import FamilyExample, FamilyHandler
from ..fileio.source import PathOrFile, open_source
from ..inspection import file_size
from ..safetensors.family import describe_header
from ..safetensors.reader import read_array, read_header
from ..safetensors.writer import write_safetensors
from ..sets.exact_values import encode_value
from ..values.destinations import description_error
from .optimizer_tree import GroupRecord, TreeDocument, build_document, parse_document, placeholder

__all__ = ["OPTIMIZER_TREE_FAMILY", "OptimizerTreeTarget", "looks_like_optimizer_tree"]


def looks_like_optimizer_tree(head: bytes, remaining: int) -> bool:
    """Whether a file starting with ``head`` is an optimizer tree as written by tlckpt: a
    header length whose upper four bytes are zero (as the safetensors family's sniff asks;
    the reader then checks it against the limit and the file), then
    :data:`~tlckpt.formats.optimizer_tree.HEAD`."""
    if len(head) <= HEADER_LENGTH_SIZE + len(HEAD):
        return False
    length = unpack_u64(head)
    return 0 < length < 1 << 32 and head[HEADER_LENGTH_SIZE:].startswith(HEAD)


@dataclass(frozen=True)
class OptimizerTreeTarget:
    """What an optimizer-tree file must be to load where the reference loads.

    Attributes:
        optimizer_class: the optimizer's ``module.qualname``.
        groups: per group, ``(name, dtype word, shape)`` of each parameter, in order.
        source: where the destination came from, for messages.
    """

    optimizer_class: str
    groups: tuple[tuple[tuple[str, str, tuple[int, ...]], ...], ...]
    source: str | None = None


def _target_of(document: TreeDocument, source: str | None) -> OptimizerTreeTarget:
    return OptimizerTreeTarget(
        document.optimizer_class, tuple(g.params for g in document.groups), source
    )


def check_against(document: TreeDocument, target: OptimizerTreeTarget) -> None:
    """Refuse a document another optimizer wrote.

    Raises:
        SchemaMismatchError: another class, or other groups (names, order, dtypes, shapes).
    """
    where = "" if target.source is None else f" ({target.source})"
    if document.optimizer_class != target.optimizer_class:
        raise SchemaMismatchError(
            f"the file holds {document.optimizer_class} state; the destination{where} is"
            f" {target.optimizer_class}",
            field="class",
            actual=document.optimizer_class,
            expected=target.optimizer_class,
        )
    found = tuple(g.params for g in document.groups)
    if len(found) != len(target.groups):
        raise SchemaMismatchError(
            f"the file has {len(found)} param groups; the destination{where} has"
            f" {len(target.groups)}",
            field="groups",
            actual=len(found),
            expected=len(target.groups),
        )
    for i, (got, want) in enumerate(zip(found, target.groups)):
        if got != want:
            raise SchemaMismatchError(
                f"param group {i} holds {[p[0] for p in got][:5]}; the destination{where}"
                f" holds {[p[0] for p in want][:5]} (names, order, dtypes and shapes must match)",
                field=f"groups[{i}]",
                actual=[list(p) for p in got][:5],
                expected=[list(p) for p in want][:5],
            )


@dataclass(frozen=True)
class _OptimizerTreeFamily(FamilyHandler):
    def sniff(self, head: bytes, remaining: int) -> bool:
        return looks_like_optimizer_tree(head, remaining)

    def describe(self, file: PathOrFile, max_json_bytes: int = 0) -> dict[str, Any]:
        with open_source(file) as src:
            header = read_header(src)
        document = parse_document(header)
        return {
            "family": self.name,
            "class": document.optimizer_class,
            "groups": [
                {"params": list(g.names), "options": encode_value(g.options, ("options",))}
                for g in document.groups
            ],
            "state": {name: sorted(values) for name, values in document.state.items()},
            "version": VERSION,
            "random_counter": document.random_counter,
            "tensors": describe_header(header),
            "header_bytes": header.header_length,
            "bytes": file_size(file),
        }

    def destination(self, file: PathOrFile, max_json_bytes: int) -> OptimizerTreeTarget:
        with open_source(file) as src:
            document = parse_document(read_header(src))
        source = os.fspath(file) if isinstance(file, (str, os.PathLike)) else None
        return _target_of(document, source)

    def parse_destination(self, description: Mapping[str, Any], source: str) -> Any:
        cls, groups = description.get("class"), description.get("groups")
        if not isinstance(cls, str) or not isinstance(groups, list):
            raise description_error(f"{source}: needs 'class' and a list of 'groups'")
        out = []
        for i, g in enumerate(groups):
            params = g.get("params") if isinstance(g, Mapping) else None
            if not isinstance(params, list):
                raise description_error(f"{source}: groups[{i}] needs 'params'")
            triples = []
            for p in params:
                ok = isinstance(p, list) and len(p) == 3 and isinstance(p[0], str)
                ok = ok and isinstance(p[1], str) and isinstance(p[2], list)
                if not ok or not all(type(d) is int and d >= 0 for d in p[2]):
                    raise description_error(
                        f"{source}: groups[{i}].params entries are [name, dtype, [dims]]"
                    )
                triples.append((p[0], p[1], tuple(p[2])))
            out.append(tuple(triples))
        return OptimizerTreeTarget(cls, tuple(out), source)

    def examples(self) -> tuple[FamilyExample, ...]:
        rng = np.random.default_rng(21)
        weight = rng.standard_normal((3, 4)).astype("<f4")
        bias = rng.standard_normal(4).astype("<f4")
        tensors = {
            "state/lin.weight/momentum_buffer": weight,
            "state/lin.bias/momentum_buffer": bias,
            "state/lin.weight/step": np.asarray(3.0, dtype="<f4"),
        }
        names = list(tensors)
        groups = [
            GroupRecord(
                (("lin.weight", "F32", (3, 4)), ("lin.bias", "F32", (4,))),
                {"lr": 0.1, "momentum": 0.9, "betas": (0.9, float("inf")), "foreach": None},
            )
        ]
        state = {
            "lin.weight": {"momentum_buffer": placeholder(0), "step": placeholder(2)},
            "lin.bias": {"momentum_buffer": placeholder(1), "history": [None, 2**70]},
        }
        metadata = build_document("torch.optim.sgd.SGD", names, groups, state)
        buffer = io.BytesIO()
        write_safetensors(buffer, tensors, metadata=metadata)
        data = buffer.getvalue()
        return (FamilyExample("optimizer_tree_sgd", data, self.destination(io.BytesIO(data), 0)),)

    def takes(self, target: Any) -> bool:
        return isinstance(target, OptimizerTreeTarget)

    def read(self, file: PathOrFile, target: Any, payloads: bool, max_json_bytes: int) -> Any:
        with open_source(file) as src:
            header = read_header(src)
            document = parse_document(header)
            if isinstance(target, OptimizerTreeTarget):
                check_against(document, target)
            if not payloads:
                return document
            arrays = {name: read_array(src, header, e) for name, e in header.entries.items()}
        return document, arrays


OPTIMIZER_TREE_FAMILY = _OptimizerTreeFamily(
    name=FAMILY,
    label="optimizer tree",
    contents="any torch.optim optimizer's state, by parameter name",
    title="optimizer state trees (safetensors layout)",
)

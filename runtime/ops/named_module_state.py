"""Model state of any dtype ↔ the safetensors layout, by name (``save_module_state`` and
``load_module_state`` for ``.safetensors`` files).

Saving writes ``state_dict()``'s tensors under their names, in any dtype the layout holds.
Tied tensors (one view registered under several names) are stored once, under the first
name in ``state_dict`` order; each other name is a ``__metadata__`` entry ``other → kept`` —
the representation ``safetensors.torch.save_model`` uses, so its ``load_model`` and this
module read each other's files.

Loading is planned, then committed (:mod:`.plans`): the header is checked whole; each model
name is matched to a file tensor (its own, or the kept name its metadata entry points to);
dtypes and shapes must be equal (no silent conversion); under a read lease the payloads
are then read straight into the live tensors by the commit (:mod:`.named_in_place`), else
every needed tensor is read into fresh memory in one pass in file order
(:mod:`.entry_staging`), then moved to the live tensor's device; only then are all values
copied in, with Ctrl-C held back. A file tensor feeding names the live model ties must not
disagree with another.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from ...codec.errors import ConfigError, SchemaMismatchError
from ...codec.fileio.source import PathOrFile, open_source
from ...codec.safetensors import Header, write_safetensors
from ...codec.safetensors.reader import read_header
from ..commit.plans import Plan, StatePlan
from . import named_in_place
from .entry_staging import stage_entries
from .state_tensors import ModuleOrTensors, NamedTensors, state_tensors, tied_copies
from .tensor_files import tensor_data, torch_dtype, torch_shape

__all__ = ["save_named_state", "plan_named_load", "check_fits", "require_same"]


def save_named_state(module_or_tensors: ModuleOrTensors, path: PathOrFile) -> None:
    """Write the model's state as a safetensors file, tied tensors once (see the module
    docstring); the bytes are ``save_model``'s for the same model.

    Raises:
        CheckpointError: a state entry the layout cannot hold (a DTensor, a sparse tensor,
            complex128); nothing is written.
        OSError: from the file system.
    """
    named = state_tensors(module_or_tensors)
    items = {name: tensor_data(t, name) for name, t in named}  # every entry checked first
    copies = tied_copies(named)
    metadata = {named[i][0]: named[j][0] for i, j in sorted(copies.items())} or None
    for i in copies:
        del items[named[i][0]]
    write_safetensors(path, items, metadata=metadata)


def _sources(named: NamedTensors, header: Header) -> tuple[dict[str, str], list[str]]:
    """Model name → the file tensor it loads from, and the file tensors no name uses."""
    aliases = header.metadata or {}
    sources: dict[str, str] = {}
    for name, _ in named:
        if name in header.entries:
            sources[name] = name
        elif aliases.get(name) in header.entries:
            sources[name] = aliases[name]
    used = set(sources.values())
    return sources, [n for n in header.entries if n not in used]


def check_fits(name: str, live: torch.Tensor, header: Header, source: str) -> None:
    """Refuse file tensor ``source`` for model tensor ``name`` unless its dtype and shape
    are ``live``'s (a DTensor's: its global shape).

    Raises:
        ConfigError: the dtypes differ (a load does not convert).
        SchemaMismatchError: the shapes differ.
    """
    entry = header.entries[source]
    dtype = torch_dtype(entry)
    require_same(name, live, dtype, torch_shape(entry, dtype), source, "the file")


def require_same(
    name: str,
    live: torch.Tensor,
    dtype: torch.dtype,
    shape: tuple[int, ...],
    source: str,
    where: str,
) -> None:
    """Refuse a tensor of ``dtype`` and ``shape`` (``source`` in ``where``: a file, a
    folder) for model tensor ``name`` unless they are ``live``'s.

    Raises:
        ConfigError: the dtypes differ (a load does not convert).
        SchemaMismatchError: the shapes differ.
    """
    alias = "" if source == name else f" (as {source!r})"
    if dtype != live.dtype:
        raise ConfigError(
            f"tensor {name!r} is {live.dtype} in the model and {dtype} in {where}{alias}; a"
            " load does not convert",
            field=name,
            actual=str(dtype),
            expected=str(live.dtype),
        )
    if tuple(shape) != tuple(live.shape):
        raise SchemaMismatchError(
            f"tensor {name!r} has shape {list(live.shape)} in the model and {list(shape)} in"
            f" {where}{alias}",
            field=name,
            actual=list(shape),
            expected=list(live.shape),
        )


def plan_named_load(
    module_or_tensors: ModuleOrTensors, path: PathOrFile, *, strict: bool, lease: bool = False
) -> tuple[Plan, list[str], list[str]]:
    """Read and check a safetensors file for the model; nothing live changes.

    With ``lease``, a path this process gets a read lease on is loaded in place
    (:mod:`.named_in_place`): the plan holds the file, its commit reads the payloads into the
    live tensors. Otherwise every value is staged.

    Returns:
        The plan (its commit copies every value in), the missing model names and the
        unexpected file names.

    Raises:
        SchemaMismatchError: with ``strict``, names missing or unexpected; any shape that
            differs; tied names given different values.
        ConfigError: a dtype that differs.
        CheckpointError: the file is not a valid safetensors file.
    """
    named = state_tensors(module_or_tensors)
    with contextlib.ExitStack() as stack:
        opened = stack.enter_context(named_in_place.open_leased(path)) if lease else None
        with open_source(path if opened is None else opened[0]) as src:
            header = read_header(src)
            sources, unexpected = _sources(named, header)
            missing = [name for name, _ in named if name not in sources]
            if strict and (missing or unexpected):
                raise SchemaMismatchError(
                    f"the names differ: missing in the file {missing[:8]}, unexpected in the"
                    f" file {unexpected[:8]} (strict=False loads the names both have)",
                    field="names",
                    actual=unexpected[:8],
                    expected=missing[:8],
                )
            for name, live in named:
                if name in sources:
                    check_fits(name, live, header, sources[name])
            stamp = src.stamp
            if opened is None:
                staged = stage_entries(src, header, sources.values())
                written = _untied(named, sources, header, staged, None, stamp)
                return _staged_plan(named, written, staged), missing, unexpected
        written = _untied(named, sources, header, None, opened, stamp)
        plan = named_in_place.plan_in_place(named, written, header, opened, stamp, stack)
        if plan is not None:
            return plan, missing, unexpected
        with named_in_place.reopened(opened[0], stamp) as src:  # memory overlaps: stage
            staged = stage_entries(src, header, written.values())
    return _staged_plan(named, written, staged), missing, unexpected


def _staged_plan(
    named: NamedTensors, written: dict[str, str], staged: dict[str, torch.Tensor]
) -> StatePlan:
    """The plan that copies each staged value into its live tensor."""
    # Copied into the live tensors, never by giving them the staged storages: code that holds
    # a parameter's memory (DDP's reducer, CUDA graphs, pinned views) must see the new
    # values where the old ones were — a load that swapped storages broke a DDP resume.
    pairs = [
        (live, _to_device(staged[written[name]], live)) for name, live in named if name in written
    ]
    return StatePlan(pairs)


def _untied(
    named: NamedTensors,
    sources: dict[str, str],
    header: Header,
    staged: dict[str, torch.Tensor] | None,
    opened: tuple[Any, Any] | None,
    stamp: Any,
) -> dict[str, str]:
    """``sources`` without the model's tied copies (their originals are written), once each
    copy's file tensor is found equal to its original's: staged, or in the leased file."""
    copies = tied_copies(named)
    written = dict(sources)
    for i, j in copies.items():
        name, other = named[i][0], named[j][0]
        if name not in sources:
            continue
        if other in sources:  # one memory: the original is written
            a, b = sources[name], sources[other]
            if a != b and not _equal(a, b, header, staged, opened, stamp):
                raise SchemaMismatchError(
                    f"{name!r} and {other!r} are one tensor in the model and differ in the file",
                    field=name,
                )
            del written[name]
    return written


def _equal(
    a: str,
    b: str,
    header: Header,
    staged: dict[str, torch.Tensor] | None,
    opened: tuple[Any, Any] | None,
    stamp: Any,
) -> bool:
    if staged is not None:
        return torch.equal(_bytes(staged[a]), _bytes(staged[b]))
    return named_in_place.same_in_file(header, header.entries[a], header.entries[b], opened, stamp)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


def _to_device(value: torch.Tensor, live: Any) -> torch.Tensor:
    return value if live.device.type == "cpu" else value.to(live.device)

"""``tlckpt convert``: model state among TLSF32B, exact-bits JSON, safetensors and ``.pt``.

Every conversion is exact or refused:

* the target keeps each value's bits where it holds the source's scalar type; where it holds
  another type (float64 into ``TLSF32B``, an int64 buffer into a float32 file), every value
  must convert exactly both ways, else :class:`~tlckpt.codec.errors.ConfigError` names the
  tensor and the first value that does not fit;
* TorchLean files are positional, safetensors and ``.pt`` files are named. Going to a named
  file, tensors are called ``"0"``, ``"1"``, ... (or take the names of a reference file); the
  order is kept in the safetensors ``__metadata__`` entry ``tlckpt.order``, so converting back
  restores it. A safetensors file without that entry is read in its keys' sorted order.
* ``.pt`` files are read only with ``torch.load(weights_only=True)``: no code runs.

TLSF32B ↔ JSON needs only numpy; safetensors, ``.pt`` and conversions of bfloat16, float8
and complex32 values use torch.
"""

from __future__ import annotations

import collections
import os
from typing import Any

import orjson

from ..codec import (
    CheckpointError,
    ConfigError,
    MalformedError,
    SchemaMismatchError,
    UnsupportedFormatError,
    atomic_output,
    inspect,
    read_float32_state,
    read_state_bits,
    write_float32_state,
    write_state_bits,
)
from ..formats.state_bits import ENCODINGS, encoding_by_name
from ..optional import require
from . import progress
from .tensor_state import (
    INTEGER_DTYPES,
    State,
    StateTensor,
    exact_cast,
    from_torch,
    label,
    to_torch,
    torch_module,
)

__all__ = [
    "FORMATS",
    "EXTENSIONS",
    "ORDER_KEY",
    "SAFETENSORS_MISSING",
    "format_of_path",
    "read_state",
    "write_state",
    "convert",
]

#: Format names (``--to``) and what they are.
FORMATS: dict[str, str] = {
    "tlsf32": "TLSF32B",
    "json": "exact-bits JSON",
    "safetensors": "safetensors",
    "pt": "torch state_dict",
}
#: File extension → format name.
EXTENSIONS: dict[str, str] = {
    ".tlsf32": "tlsf32",
    ".json": "json",
    ".safetensors": "safetensors",
    ".pt": "pt",
    ".pth": "pt",
}
#: safetensors ``__metadata__`` key holding the tensors' order (a JSON list of names).
ORDER_KEY = "tlckpt.order"


def format_of_path(path: str | os.PathLike) -> str | None:
    """The format name for a path's extension, or ``None``."""
    return EXTENSIONS.get(os.path.splitext(os.fspath(path))[1].lower())


# --------------------------------------------------------------------------- reading


def _read_tlsf32(path: str | os.PathLike) -> State:
    with progress.reading(path, "reading") as src:
        shapes = [tuple(t["shape"]) for t in inspect(src)["tensors"]]
    with progress.reading(path, "reading") as src:
        arrays = read_float32_state(src, shapes)
    return State([StateTensor(None, "float32", a) for a in arrays], "float32", named=False)


def _read_json(path: str | os.PathLike) -> State:
    with progress.reading(path, "reading") as src:
        info = inspect(src)
    if info["family"] != "state_bits":
        raise UnsupportedFormatError(
            f"{os.fspath(path)}: a .json file must be exact-bits JSON state, this is a"
            f" {info.get('magic', info['family'])} file",
            field="format",
        )
    encoding = info["encoding"] or info["format"]
    shapes = [tuple(t["shape"]) for t in info["tensors"]]
    with progress.reading(path, "reading") as src:
        arrays = read_state_bits(src, shapes, info["format"])
    return State([StateTensor(None, encoding, a) for a in arrays], encoding, named=False)


def _read_safetensors(path: str | os.PathLike) -> State:
    torch_module()
    safetensors = _safetensors()
    try:
        with safetensors.safe_open(os.fspath(path), framework="pt") as f:
            keys = list(f.keys())
            order = _order(path, (f.metadata() or {}).get(ORDER_KEY), keys)
            tensors = [from_torch(k, f.get_tensor(k)) for k in order]
    except safetensors.SafetensorError as exc:
        raise MalformedError(
            f"not a readable safetensors file: {exc}", path=path, field="header"
        ) from None
    return State(tensors, None, named=True)


def _safetensors() -> Any:
    require("safetensors.torch", "converting safetensors files")
    import safetensors

    return safetensors


def _order(path: str | os.PathLike, stored: str | None, keys: list[str]) -> list[str]:
    if stored is None:
        return sorted(keys)
    try:
        names = orjson.loads(stored)
    except orjson.JSONDecodeError:
        names = None
    if (
        not isinstance(names, list)
        or not all(isinstance(n, str) for n in names)
        or sorted(names) != sorted(keys)
    ):
        raise MalformedError(
            f"safetensors metadata {ORDER_KEY!r} does not list the file's tensors exactly once",
            path=path,
            field=f"__metadata__.{ORDER_KEY}",
        )
    return names


def _read_pt(path: str | os.PathLike) -> State:
    torch = torch_module()
    try:
        loaded = torch.load(os.fspath(path), map_location="cpu", weights_only=True)
    except OSError:
        raise
    except Exception as exc:  # torch raises a zoo of types on hostile bytes; none may escape
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UnsupportedFormatError(
            f"not a torch state_dict loadable with weights_only=True: {first}", path=path
        ) from None
    if isinstance(loaded, dict):
        items = list(loaded.items())
        named = True
    elif isinstance(loaded, (list, tuple)):
        items = [(None, t) for t in loaded]
        named = False
    else:
        raise MalformedError(
            f"expected a state_dict (a mapping of names to tensors), found a"
            f" {type(loaded).__name__}",
            path=path,
        )
    tensors = []
    for name, t in items:
        if not isinstance(t, torch.Tensor):
            raise MalformedError(
                f"entry {name!r} is a {type(t).__name__}, not a tensor; only flat"
                " state_dicts convert",
                path=path,
                field=str(name),
            )
        if name is not None and not isinstance(name, str):
            raise MalformedError(f"key {name!r} is not a string", path=path, field=str(name))
        tensors.append(from_torch(name, t))
    return State(tensors, None, named=named)


_READERS = {
    "tlsf32": _read_tlsf32,
    "json": _read_json,
    "safetensors": _read_safetensors,
    "pt": _read_pt,
}


def read_state(path: str | os.PathLike, fmt: str) -> State:
    """Read a model-state file of format ``fmt`` (a key of :data:`FORMATS`).

    Raises:
        CheckpointError: the file is not a well-formed file of that format.
        OSError: from the file system.
    """
    return _READERS[fmt](path)


# --------------------------------------------------------------------------- writing


def _json_encoding(state: State, requested: str | None) -> str:
    if requested is not None:
        if encoding_by_name(requested) is None:
            raise ConfigError(
                f"unknown encoding {requested!r}; expected one of {', '.join(ENCODINGS)}"
                " or a torchlean_state_*_v1 tag",
                field="dtype",
                actual=requested,
            )
        return requested
    floating = []
    for t in state.tensors:
        if t.encoding not in INTEGER_DTYPES and t.encoding not in floating:
            floating.append(t.encoding)
    if len(floating) > 1:
        raise ConfigError(
            f"the state mixes {' and '.join(floating)} tensors and one JSON file holds one"
            " scalar type; pass --dtype to convert all of them (exactly) to one",
            field="dtype",
            actual=floating,
        )
    if floating:
        return floating[0]
    return state.encoding or "float64"  # binary64 holds every integer up to 2^53


def _names(state: State, names: list[str] | None) -> list[str]:
    if names is not None:
        return names
    if state.named:
        return [str(t.name) for t in state.tensors]
    return [str(i) for i in range(len(state.tensors))]


#: Encodings torch has and safetensors 0.8 does not (its dtype table lacks them).
SAFETENSORS_MISSING = frozenset({"complex128", "complex32"})


def _write_named(state: State, path: str | os.PathLike, fmt: str, names: list[str]) -> None:
    torch = torch_module()
    if fmt == "safetensors":
        for i, t in enumerate(state.tensors):
            if t.encoding in SAFETENSORS_MISSING:
                raise ConfigError(
                    f"{label(t, i)} is {t.encoding}, which safetensors cannot hold;"
                    " convert it to .pt or exact-bits JSON instead",
                    field=t.name or f"tensors[{i}]",
                    actual=t.encoding,
                )
    tensors = [to_torch(t) for t in state.tensors]
    if len(set(names)) != len(names):
        raise CheckpointError("tensor names are not unique", field="names")
    if fmt == "safetensors":
        save = _safetensors().torch.save

        data = save(dict(zip(names, tensors)), metadata={ORDER_KEY: orjson.dumps(names).decode()})
        with atomic_output(path) as f:
            f.write(data)
    else:
        with atomic_output(path) as f:
            torch.save(collections.OrderedDict(zip(names, tensors)), f)


def write_state(
    state: State,
    path: str | os.PathLike,
    fmt: str,
    *,
    encoding: str | None = None,
    names: list[str] | None = None,
    pretty: bool = True,
) -> str | None:
    """Write ``state`` to ``path`` as format ``fmt``, atomically.

    Every tensor is converted (exactly) before the first byte is written.

    Args:
        state: what :func:`read_state` returned.
        path: destination.
        fmt: a key of :data:`FORMATS`.
        encoding: the scalar type of a JSON target (default: the state's one floating type).
        names: names for a safetensors/``.pt`` target (default: the source's, else indices).
        pretty: indented JSON.

    Returns:
        The encoding written for TLSF32B/JSON targets, ``None`` for named targets (each
        tensor keeps its dtype).

    Raises:
        ConfigError: a value the target cannot hold exactly, or mixed floating types into
            JSON without ``encoding``.
        CheckpointError: other refusals (duplicate names, torch missing).
        OSError: from the file system.
    """
    if fmt == "tlsf32":
        arrays = [exact_cast(t, i, "float32") for i, t in enumerate(state.tensors)]
        total = sum(a.nbytes for a in arrays)
        write_float32_state(path, progress.counting(arrays, total, "writing"), count=len(arrays))
        return "float32"
    if fmt == "json":
        target = _json_encoding(state, encoding)
        arrays = [exact_cast(t, i, target) for i, t in enumerate(state.tensors)]
        write_state_bits(path, arrays, target, pretty=pretty)
        return target
    _write_named(state, path, fmt, _names(state, names))
    return None


def _names_from(reference: str | os.PathLike, state: State) -> list[str]:
    fmt = format_of_path(reference)
    if fmt not in ("safetensors", "pt"):
        raise CheckpointError(
            f"--names-from takes a .safetensors or .pt file, got {os.fspath(reference)!r}",
            field="names-from",
        )
    ref = read_state(reference, fmt)
    if not ref.named:
        raise CheckpointError(f"{os.fspath(reference)} holds no names", field="names-from")
    if len(ref.tensors) != len(state.tensors):
        raise SchemaMismatchError(
            f"{os.fspath(reference)} has {len(ref.tensors)} tensors, the source"
            f" {len(state.tensors)}",
            field="names-from",
            actual=len(state.tensors),
            expected=len(ref.tensors),
        )
    for i, (a, b) in enumerate(zip(ref.tensors, state.tensors)):
        if a.shape != b.shape:
            raise SchemaMismatchError(
                f"tensor {i}: shape {b.shape} in the source, {a.shape} for {a.name!r} in"
                f" {os.fspath(reference)}",
                field=f"tensors[{i}]",
                actual=b.shape,
                expected=a.shape,
            )
    return [str(t.name) for t in ref.tensors]


def convert(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    src_format: str,
    dst_format: str,
    encoding: str | None = None,
    names_from: str | os.PathLike | None = None,
    pretty: bool = True,
) -> dict[str, Any]:
    """Convert one model-state file into another format, exactly.

    Args:
        src, dst: source and destination paths.
        src_format, dst_format: keys of :data:`FORMATS`.
        encoding: scalar type of a JSON destination (see :func:`write_state`).
        names_from: a ``.safetensors``/``.pt`` file whose names (in order) name the tensors
            of a positional source.
        pretty: indented JSON.

    Returns:
        A summary: tensor count, the encoding written, and what became of the names
        (``None`` when neither file has any).

    Raises:
        CheckpointError: the source is not well-formed or the destination cannot hold it
            exactly; the destination is then untouched.
        OSError: from the file system.
    """
    state = read_state(src, src_format)
    names = None if names_from is None else _names_from(names_from, state)
    written = write_state(state, dst, dst_format, encoding=encoding, names=names, pretty=pretty)
    if dst_format in ("tlsf32", "json"):
        kept = "dropped (TorchLean files are positional)" if state.named else None
    elif names is not None:
        kept = f"taken from {os.fspath(names_from)}"
    else:
        kept = "kept" if state.named else "are the positions 0..n-1"
    return {
        "source": FORMATS[src_format],
        "target": FORMATS[dst_format],
        "tensors": len(state.tensors),
        "encoding": written,
        "names": kept,
    }

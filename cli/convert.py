"""``tlckpt convert``: model state among TLSF32B, exact-bits JSON, safetensors and ``.pt``.

Every conversion is exact or refused:

* the target keeps each value's bits where it holds the source's scalar type; where it holds
  another type (float64 into ``TLSF32B``, an int64 buffer into a float32 file), every value
  must convert exactly both ways, else :class:`~tlckpt.codec.errors.ConfigError` names the
  tensor and the first value that does not fit;
* TorchLean files are positional, safetensors and ``.pt`` files are named. Going to a named
  file, tensors are called ``"0"``, ``"1"``, ... (or take the names of a reference file); the
  order is kept in the safetensors ``__metadata__`` entry ``tlckpt.order``, so converting back
  restores it. A safetensors file without that entry (written by another tool) does not say
  in which order its tensors go: going to a positional file it needs the order given
  (``names_from``: a text file of names, a ``.pt`` state_dict or a tlckpt-written safetensors
  file, or in the API a list of names, a state_dict or a module), else it is refused — taking
  the keys' sorted order would silently permute ``layers.10`` before ``layers.2``.
* ``.pt`` files are read only with ``torch.load(weights_only=True)``: no code runs.

TLSF32B ↔ JSON needs only numpy; safetensors, ``.pt`` and conversions of bfloat16, float8
and complex32 values use torch.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from ..codec import (
    DEFAULT_MAX_JSON_BYTES,
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
from ..codec.errors import names_the_file
from ..codec.families import families_differ
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
    "names_in",
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
#: Formats whose tensors are known by position only.
POSITIONAL = frozenset({"tlsf32", "json"})


def format_of_path(path: str | os.PathLike) -> str | None:
    """The format name for a path's extension, or ``None``."""
    return EXTENSIONS.get(os.path.splitext(os.fspath(path))[1].lower())


# --------------------------------------------------------------------------- reading


def _read_tlsf32(path: str | os.PathLike, max_json_bytes: int) -> State:
    with progress.reading(path, "reading") as src:
        info = inspect(src, max_json_bytes=max_json_bytes)
    if info["family"] != "float32_state":
        raise families_differ(info["family"], "float32_state").with_path(path)
    shapes = [tuple(t["shape"]) for t in info["tensors"]]
    with progress.reading(path, "reading") as src:
        arrays = read_float32_state(src, shapes)
    return State([StateTensor(None, "float32", a) for a in arrays], "float32", named=False)


def _read_json(path: str | os.PathLike, max_json_bytes: int) -> State:
    with progress.reading(path, "reading") as src:
        info = inspect(src, max_json_bytes=max_json_bytes)
    if info["family"] != "state_bits":
        raise families_differ(info["family"], "state_bits").with_path(path)
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
            stored = (f.metadata() or {}).get(ORDER_KEY)
            # Without tlckpt's order the file does not say which tensor comes first: name
            # order here, marked unordered (a positional target then needs the order given).
            order = sorted(keys) if stored is None else _order(path, stored, keys)
            tensors = [from_torch(k, f.get_tensor(k)) for k in order]
    except safetensors.SafetensorError as exc:
        raise MalformedError(
            f"not a readable safetensors file: {exc}", path=path, field="header"
        ) from None
    return State(tensors, None, named=True, ordered=stored is not None)


def _safetensors() -> Any:
    require("safetensors.torch", "converting safetensors files")
    import safetensors

    return safetensors


def _order(path: str | os.PathLike, stored: str, keys: list[str]) -> list[str]:
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


#: Readers of the named formats; TorchLean files are described (under the JSON cap) first.
_NAMED_READERS = {"safetensors": _read_safetensors, "pt": _read_pt}
_TORCHLEAN_READERS = {"tlsf32": _read_tlsf32, "json": _read_json}


def read_state(
    path: str | os.PathLike, fmt: str, *, max_json_bytes: int = DEFAULT_MAX_JSON_BYTES
) -> State:
    """Read a model-state file of format ``fmt`` (a key of :data:`FORMATS`).

    Args:
        path: the file.
        fmt: its format.
        max_json_bytes: the largest exact-bits JSON file read (the cap of
            :func:`tlckpt.inspect`, which describes a TorchLean file before it is read).

    Raises:
        CheckpointError: the file is not a well-formed file of that format.
        OSError: from the file system.
    """
    if fmt in _TORCHLEAN_READERS:
        return _TORCHLEAN_READERS[fmt](path, max_json_bytes)
    return _NAMED_READERS[fmt](path)


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
    if fmt in POSITIONAL and not state.ordered:
        raise CheckpointError(
            f"this safetensors file has no {ORDER_KEY!r} metadata (tlckpt writes it; other"
            f" tools do not), so it does not say in which order its tensors go, and"
            f" {FORMATS[fmt]} files are positional: give the model's order with --names-from"
            " FILE (a text file of names, one per line, or a .pt state_dict or a"
            " tlckpt-written .safetensors file whose order to copy), or names_from= in the"
            " API (also a list of names, a state_dict or a module)",
            field=f"__metadata__.{ORDER_KEY}",
        )
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


#: What gives tensor names in order: a file (see :func:`names_in`), a sequence of names, a
#: mapping (a state_dict: its keys) or a module (its ``state_dict()``'s keys).
NameSource = Any


def _label(reference: NameSource) -> str:
    if isinstance(reference, (str, os.PathLike)):
        return os.fspath(reference)
    return "the given names"


def _unique_names(names: list[Any], where: str) -> list[str]:
    seen: set[str] = set()
    for name in names:
        if not isinstance(name, str):
            raise CheckpointError(f"{where}: name {name!r} is not a string", field="names-from")
        if name in seen:
            raise CheckpointError(f"{where}: name {name!r} appears twice", field="names-from")
        seen.add(name)
    return names


def _names_in_file(path: str | os.PathLike) -> list[str]:
    where = os.fspath(path)
    fmt = format_of_path(path)
    if fmt == "safetensors":
        safetensors = _safetensors()
        try:
            with safetensors.safe_open(where, framework="numpy") as f:
                keys, stored = list(f.keys()), (f.metadata() or {}).get(ORDER_KEY)
        except safetensors.SafetensorError as exc:
            raise MalformedError(
                f"not a readable safetensors file: {exc}", path=path, field="header"
            ) from None
        if stored is None:
            raise CheckpointError(
                f"{where} has no {ORDER_KEY!r} metadata either: its order is not known",
                field="names-from",
            )
        return _order(path, stored, keys)
    if fmt == "pt":
        ref = read_state(path, fmt)
        if not ref.named:
            raise CheckpointError(f"{where} holds no names", field="names-from")
        return [str(t.name) for t in ref.tensors]
    if fmt in POSITIONAL:
        raise CheckpointError(
            f"{where} is positional and holds no names; --names-from takes a text file of"
            " names, one per line, or a .pt/.safetensors file",
            field="names-from",
        )
    with open(path, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedError(
            f"a names file is UTF-8 text, one name per line: {exc}",
            path=path,
            field="names-from",
        ) from None
    return _unique_names([line for line in text.splitlines() if line.strip()], where)


def names_in(reference: NameSource) -> list[str]:
    """Tensor names in order, from a reference.

    Args:
        reference: a path — a ``.pt``/``.pth`` state_dict (its key order), a ``.safetensors``
            file with tlckpt's order metadata, or any other file as UTF-8 text, one name per
            line (blank lines ignored) — or a sequence of names, a mapping (a state_dict:
            its keys) or a module (its ``state_dict()``'s keys).

    Returns:
        The names, each once.

    Raises:
        CheckpointError: the reference holds no names, or repeats one.
        OSError: from the file system.
    """
    if isinstance(reference, (str, os.PathLike)):
        return _names_in_file(reference)
    if isinstance(reference, Mapping):
        names = list(reference.keys())
    elif callable(getattr(reference, "state_dict", None)):
        names = list(reference.state_dict().keys())
    elif isinstance(reference, Sequence):
        names = list(reference)
    else:
        raise TypeError(
            "names_from takes a path, a sequence of names, a state_dict or a module,"
            f" not {type(reference).__name__}"
        )
    return _unique_names(names, "the given names")


def _in_order(state: State, names: list[str], where: str) -> State:
    """A named state's tensors in the order of ``names``, which must name each exactly once."""
    by_name = {t.name: t for t in state.tensors}
    listed = set(names)
    missing = [n for n in names if n not in by_name]
    extra = [str(n) for n in by_name if n not in listed]
    if missing or extra:

        def few(items: list[str]) -> str:
            return ", ".join(map(repr, items[:5])) + (
                f" and {len(items) - 5} more" if len(items) > 5 else ""
            )

        parts = [f"{len(missing)} not in the file ({few(missing)})"] if missing else []
        parts += [f"{len(extra)} of the file's not listed ({few(extra)})"] if extra else []
        raise SchemaMismatchError(
            f"the order in {where} must name exactly the file's {len(by_name)} tensors: "
            + "; ".join(parts),
            field="names-from",
            actual=sorted(listed),
            expected=sorted(map(str, by_name)),
        )
    return State([by_name[n] for n in names], state.encoding, named=True, ordered=True)


def _names_from(reference: NameSource, state: State) -> list[str]:
    """Names for a positional state's tensors, from a reference with as many (and, for a
    model-state file, the same shapes)."""
    where = _label(reference)
    fmt = format_of_path(reference) if isinstance(reference, (str, os.PathLike)) else None
    if fmt in ("safetensors", "pt"):
        ref = read_state(reference, fmt)
        if not ref.named:
            raise CheckpointError(f"{where} holds no names", field="names-from")
        if not ref.ordered:
            raise CheckpointError(
                f"{where} has no {ORDER_KEY!r} metadata: the order of its names is not known",
                field="names-from",
            )
        shapes: list[tuple[int, ...]] | None = [t.shape for t in ref.tensors]
        names = [str(t.name) for t in ref.tensors]
    else:
        shapes, names = None, names_in(reference)
    if len(names) != len(state.tensors):
        raise SchemaMismatchError(
            f"{where} has {len(names)} tensors, the source {len(state.tensors)}",
            field="names-from",
            actual=len(state.tensors),
            expected=len(names),
        )
    for i, (want, t) in enumerate(zip(shapes or [], state.tensors)):
        if want != t.shape:
            raise SchemaMismatchError(
                f"tensor {i}: shape {t.shape} in the source, {want} for {names[i]!r} in {where}",
                field=f"tensors[{i}]",
                actual=t.shape,
                expected=want,
            )
    return names


@names_the_file("src")
def convert(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    src_format: str,
    dst_format: str,
    encoding: str | None = None,
    names_from: NameSource | None = None,
    pretty: bool = True,
    max_json_bytes: int = DEFAULT_MAX_JSON_BYTES,
) -> dict[str, Any]:
    """Convert one model-state file into another format, exactly.

    Args:
        src, dst: source and destination paths.
        src_format, dst_format: keys of :data:`FORMATS`.
        encoding: scalar type of a JSON destination (see :func:`write_state`).
        names_from: names in order (see :func:`names_in`). For a positional source (TLSF32B,
            JSON) going to a named file: the names of its tensors. For a named source: the
            order of its tensors, naming each exactly once — required to write a positional
            file from a safetensors file without tlckpt's order metadata.
        pretty: indented JSON.
        max_json_bytes: the largest exact-bits JSON source read (see :func:`read_state`).

    Returns:
        A summary: tensor count, the encoding written, and what became of the names
        (``None`` when neither file has any).

    Raises:
        CheckpointError: the source is not well-formed or the destination cannot hold it
            exactly, or the source's order is not known and is needed; the destination is
            then untouched.
        OSError: from the file system.
    """
    state = read_state(src, src_format, max_json_bytes=max_json_bytes)
    names = None
    ordered_by = None
    if names_from is not None:
        if state.named:
            state = _in_order(state, names_in(names_from), _label(names_from))
            ordered_by = _label(names_from)
        else:
            names = _names_from(names_from, state)
    written = write_state(state, dst, dst_format, encoding=encoding, names=names, pretty=pretty)
    if dst_format in POSITIONAL:
        kept = "dropped (TorchLean files are positional)" if state.named else None
        if ordered_by is not None:
            kept = f"dropped, tensors in the order of {ordered_by}"
    elif names is not None:
        kept = f"taken from {_label(names_from)}"
    elif ordered_by is not None:
        kept = f"kept, in the order of {ordered_by}"
    else:
        kept = "kept" if state.named else "are the positions 0..n-1"
    return {
        "source": FORMATS[src_format],
        "target": FORMATS[dst_format],
        "tensors": len(state.tensors),
        "encoding": written,
        "names": kept,
    }

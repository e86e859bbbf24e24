"""State trees ↔ one safetensors file: ``save_state`` and ``load_state``.

A state tree is what trainers checkpoint: nested dicts, lists and tuples (and the other
containers :mod:`tlckpt.codec.exact_values` holds) of tensors and plain values. Its tensors
go into the file as ordinary safetensors tensors, named after their place in the tree
(``optimizer.state[0].exp_avg``), so any safetensors reader opens them; the tree itself —
structure, non-tensor values, and which tensor sits where — is the ``__metadata__`` entry
:data:`STATE_KEY`, a JSON object::

    {"version": 1, "tensors": [name, ...], "tree": <exact tagged JSON>}

in which each tensor is the tagged scalar ``{"$tensor": ["file_tensor", i]}`` standing for
``tensors[i]``. The same view of the same memory in several places (one tensor object, or
tied weights in a ``state_dict``) is stored once and comes back as one object. Values JSON
cannot hold exactly are refused before anything is written, naming their path; nothing is
ever pickled.
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict, deque
from collections.abc import Callable
from typing import Any

import orjson
import torch

from ...codec.errors import MalformedError, SchemaMismatchError, names_the_file
from ...codec.exact_json.json_document import parse_embedded_json
from ...codec.fileio.source import PathOrFile, open_source
from ...codec.safetensors import write_safetensors
from ...codec.safetensors.reader import read_header
from ...codec.safetensors.writer import TensorData
from ...codec.sets.exact_values import TensorScalar, decode_value, encode_value, json_path
from .tensor_files import read_entry, tensor_data

__all__ = ["STATE_KEY", "STATE_VERSION", "encode_state", "save_state", "load_state"]

#: The ``__metadata__`` entry holding the tree.
STATE_KEY = "tlckpt.state"
#: The version of that entry's layout.
STATE_VERSION = 1
#: The tagged-scalar dtype word standing for a file tensor.
_PLACEHOLDER = "file_tensor"

_Leaf = Callable[[Any, tuple], Any]


def _map_tree(value: Any, path: tuple, leaf: _Leaf) -> Any:
    """``value`` with each container rebuilt (same exact type) and each other value passed
    through ``leaf(value, path)``. Keys and set items are kept as they are."""
    kind = type(value)
    if kind is list:
        return [_map_tree(v, (*path, i), leaf) for i, v in enumerate(value)]
    if kind is tuple:
        return tuple(_map_tree(v, (*path, i), leaf) for i, v in enumerate(value))
    if kind is deque:
        items = (_map_tree(v, (*path, i), leaf) for i, v in enumerate(value))
        return deque(items, maxlen=value.maxlen)
    if kind in (dict, OrderedDict, defaultdict):
        pairs = [
            (k, _map_tree(v, (*path, _part(k, i)), leaf)) for i, (k, v) in enumerate(value.items())
        ]
        if kind is defaultdict:
            return defaultdict(value.default_factory, pairs)
        return kind(pairs)
    return leaf(value, path)


def _part(key: Any, index: int) -> Any:
    return key if type(key) in (str, int) else f"<key {index}>"


def _identity(tensor: torch.Tensor) -> Any:
    """What makes two tensors one in the file: the same view of the same memory (tied
    weights in a ``state_dict`` are distinct objects over one view). Empty tensors and
    tensor subclasses are told apart by object."""
    if tensor.numel() == 0 or type(tensor) not in (torch.Tensor, torch.nn.Parameter):
        return ("object", id(tensor))
    return (
        tensor.device,
        tensor.untyped_storage().data_ptr(),
        tensor.storage_offset(),
        tuple(tensor.shape),
        tensor.stride(),
        tensor.dtype,
    )


class _Collected:
    """The tensors of a tree, each object once, with unique path-derived names."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.tensors: list[torch.Tensor] = []
        self._index: dict[Any, int] = {}
        self._taken: set[str] = set()

    def __call__(self, value: Any, path: tuple) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        key = _identity(value)
        index = self._index.get(key)
        if index is None:
            index = len(self.tensors)
            self._index[key] = index
            name = json_path(path) or "tensor"
            unique, n = name, 1
            while unique in self._taken:
                n += 1
                unique = f"{name}#{n}"
            self._taken.add(unique)
            self.names.append(unique)
            self.tensors.append(value)
        return TensorScalar(_PLACEHOLDER, index)


@names_the_file()
def save_state(tree: Any, path: PathOrFile) -> None:
    """Write a state tree as one safetensors file, atomically and durably.

    Args:
        tree: nested ``dict``/``list``/``tuple`` (and ``OrderedDict``, ``defaultdict``,
            ``deque``, ``set``, ``Counter``) of tensors and ``None``/``bool``/``int``/
            ``float``/``str`` values. Tensors may be of any dtype the layout holds and any
            device; non-finite floats, big ints, tuples and non-string keys are kept exactly.
        path: destination path, or a binary file object written at its position.

    Raises:
        CheckpointError: a value the file cannot hold exactly (an object, a sparse tensor, a
            tensor as a dict key, a dtype the layout lacks, too deep a tree); the message
            names its path in the tree. Raised before anything is written.
        OSError: from the file system; the previous file is untouched.

    Example:
        >>> save_state({"model": model.state_dict(), "step": 10}, "c.safetensors")  # doctest: +SKIP
    """
    items, metadata = encode_state(tree)
    write_safetensors(path, items, metadata=metadata)


def encode_state(tree: Any) -> tuple[dict[str, TensorData], dict[str, str]]:
    """A state tree as the safetensors writer takes it: its tensors (named after their place,
    each once, bytes made when written) and the ``__metadata__`` holding the tree. Nothing is
    written: what :func:`save_state` refuses is refused here.

    Args:
        tree: as :func:`save_state`.

    Returns:
        ``(tensors, metadata)`` for :func:`~tlckpt.codec.safetensors.write_safetensors`.

    Raises:
        CheckpointError: as :func:`save_state`, naming the value's path in the tree.
    """
    collected = _Collected()
    skeleton = _map_tree(tree, (), collected)
    encoded = encode_value(skeleton, ())
    document = {"version": STATE_VERSION, "tensors": collected.names, "tree": encoded}
    metadata = {STATE_KEY: orjson.dumps(document).decode()}
    items = {name: tensor_data(t, name) for name, t in zip(collected.names, collected.tensors)}
    return items, metadata


def _document(text: str) -> tuple[list[str], Any]:
    field = f"__metadata__.{STATE_KEY}"
    document = parse_embedded_json(text, field)
    if type(document) is not dict or set(document) != {"version", "tensors", "tree"}:
        raise MalformedError(f"{field} must be an object of version, tensors and tree", field=field)
    if document["version"] != STATE_VERSION or type(document["version"]) is not int:
        raise MalformedError(
            f"{field} is version {document['version']!r}; this reader knows {STATE_VERSION}",
            field=f"{field}.version",
            actual=document["version"],
            expected=STATE_VERSION,
        )
    names = document["tensors"]
    if type(names) is not list or not all(type(n) is str for n in names):
        raise MalformedError(f"{field}.tensors must be a list of names", field=field)
    return names, document["tree"]


@names_the_file()
def load_state(path: PathOrFile, *, device: str | torch.device = "cpu") -> Any:
    """Read a state tree written by :func:`save_state`, exactly.

    A safetensors file without the tree entry (written by another tool) loads as a flat
    ``dict`` of its tensors.

    Args:
        path: a path, or a seekable binary file object read from its position.
        device: where the tensors go.

    Returns:
        The tree: same containers (types, order, keys), same values, tensors bit-exact; a
        tensor that was in several places is one object in each.

    Raises:
        CheckpointError: a subclass naming what is wrong: the header, the tree entry (not
            JSON, an unknown tag, too deep), or its tensor list (a name not in the file,
            a file tensor not in the list, an index out of range).
        FileChangedError: the file changed while it was read.
        OSError: from the file system.
    """
    with open_source(path) as src:
        header = read_header(src)
        text = (header.metadata or {}).get(STATE_KEY)
        if text is None:
            loaded = {n: read_entry(src, header, e) for n, e in header.entries.items()}
            return {n: t.to(device) for n, t in loaded.items()}
        names, encoded = _document(text)
        if len(set(names)) != len(names) or set(names) != set(header.entries):
            raise SchemaMismatchError(
                f"__metadata__.{STATE_KEY} lists tensors {sorted(set(names))[:5]}...; the"
                f" file holds {sorted(header.entries)[:5]}... (each exactly once)",
                field=f"__metadata__.{STATE_KEY}.tensors",
                actual=len(names),
                expected=len(header.entries),
            )
        skeleton = decode_value(encoded, (STATE_KEY,))
        tensors = [read_entry(src, header, header.entries[n]) for n in names]
    if torch.device(device).type != "cpu":
        tensors = [t.to(device) for t in tensors]

    placed = 0

    def place(value: Any, where: tuple) -> Any:
        nonlocal placed
        if type(value) is not TensorScalar:
            return value
        placed += 1
        index = value.value
        if value.dtype != _PLACEHOLDER or type(index) is not int or not 0 <= index < len(names):
            raise MalformedError(
                f"{json_path(where)} is a tagged tensor {value.dtype!r} {index!r}; a state"
                f" tree holds file tensors 0..{len(names) - 1} only",
                field=json_path(where),
                actual=index,
            )
        return tensors[index]

    tree = _map_tree(skeleton, (), place)
    if _tagged_tensors(skeleton) != placed:
        raise MalformedError(
            f"__metadata__.{STATE_KEY} has a tagged tensor as a key or a set member; a state"
            " tree holds file tensors as values only",
            field=f"__metadata__.{STATE_KEY}.tree",
        )
    return tree


def _tagged_tensors(value: Any) -> int:
    """How many tagged tensors ``value`` holds anywhere: values, keys and set members (a
    decoded tree: its depth is bounded by the decoder)."""
    if type(value) is TensorScalar:
        return 1
    if isinstance(value, dict):
        return sum(_tagged_tensors(k) + _tagged_tensors(v) for k, v in value.items())
    if isinstance(value, (list, tuple, set, frozenset, deque)):
        return sum(_tagged_tensors(v) for v in value)
    return 0

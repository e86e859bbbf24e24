"""The registry of checkpoint families: one handler per family, beside the format registry.

:mod:`tlckpt.formats.registry` maps ``(magic, version)`` to a spec; this registry maps a
family to what the library does with its files. A :class:`FamilyHandler` says how a file of
the family is recognised from its first bytes, described (the dict :func:`tlckpt.inspect`
returns), checked against a destination (``tlckpt validate --against``, the fuzzing
campaigns), and, for model state (:class:`ModelStateFamily`), read and written whole
(``tlckpt convert``). ``inspect``,
``sniff_family``, the command line and the fuzzing harness all dispatch through it, so a new
family is one spec module in ``formats/``, its reader and writer in ``codec/``, and one
:func:`register_family` call — the built-in ones are registered in one list,
:data:`~.registrations.BUILT_IN_FAMILIES`.

Which family a file is, is decided from its first bytes (:mod:`.sniffing`, which this
registry tells of each family without a magic), so a file of the wrong kind is refused before
the rest of it is read, and a file of one family handed to a reader (or a destination) of
another is named the same way everywhere (:func:`families_differ`).
"""

from __future__ import annotations

import abc
import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ..formats import registry
from . import sniffing
from .errors import UnsupportedFormatError
from .fileio.source import PathOrFile
from .values.destinations import ModelStateTarget, parse_model_state_target

__all__ = [
    "FamilyExample",
    "FamilyHandler",
    "ModelStateFamily",
    "families",
    "family_named",
    "register_family",
    "unregister_family",
    "family_title",
    "families_differ",
]

#: Arrays to write: a sized iterable (a list, or one that produces each array on demand).
Arrays = Collection[np.ndarray]


class FamilyExample(NamedTuple):
    """A valid file of a family and the destination it loads into (a fuzzing seed).

    Attributes:
        name: a short descriptive name.
        data: the file's bytes.
        destination: what :meth:`FamilyHandler.read` checks it against.
    """

    name: str
    data: bytes
    destination: Any


@dataclass(frozen=True)
class FamilyHandler(abc.ABC):
    """One checkpoint family and what the library does with its files.

    A family is a subclass that implements the verbs below, registered once
    (:func:`register_family`). The call order of a check against a destination: first
    :meth:`destination` (from a reference file) or :meth:`parse_destination` (from a
    description), then :meth:`read` on the file to check — by this family, or by another
    whose :meth:`takes` accepts the destination.

    Attributes:
        name: the family's name: ``inspect(path)["family"]``, and ``kind`` in descriptions
            (a binary family's is the format registry's name of its magic, by default).
        label: what the family's files are called (``"TLADAMF"``, ``"exact-bits JSON"``;
            a binary family's magic, by default).
        contents: what its files hold, for messages (``"Adam/AdamW optimizer state"``).
        title: the same, for reports (``"streamed float32 model state"``; ``contents`` by
            default).
        magic: the registered magic of a binary family; ``None`` for a family told by
            :meth:`sniff` instead.
        marker: a member whose presence in a description without ``kind`` means this family.
    """

    name: str = ""
    label: str = ""
    contents: str = ""
    title: str = ""
    magic: bytes | None = None
    marker: str | None = None

    def __post_init__(self) -> None:
        # A binary family's name and label follow from its magic, so that they cannot
        # disagree with the format registry (which names a file's family by its magic).
        if self.magic is not None and not self.name:
            object.__setattr__(self, "name", registry.FAMILIES.get(self.magic, ""))
        if self.magic is not None and not self.label:
            object.__setattr__(self, "label", self.magic.decode("ascii"))
        if not self.title:
            object.__setattr__(self, "title", self.contents)

    @property
    def noun(self) -> str:
        """``"a TLSF32B file"``, ``"an exact-bits JSON file"``."""
        article = "an" if self.label[:1].lower() in "aeiou" else "a"
        return f"{article} {self.label} file"

    def header(self, version: int) -> dict[str, Any]:
        """The first keys of a binary family's description: family, magic and version."""
        return {"family": self.name, "magic": self.label, "version": version}

    def sniff(self, head: bytes, remaining: int) -> bool:
        """For a family without a magic: whether a file whose first bytes are ``head``
        (``remaining`` bytes in all) is one of its files, as far as the head can tell (its
        reader then says what is wrong). A family with a magic is told by it alone."""
        return False

    @abc.abstractmethod
    def describe(self, file: PathOrFile, max_json_bytes: int) -> dict[str, Any]:
        """The whole file checked against its own layout, and described: what
        :func:`tlckpt.inspect` returns for it."""

    @abc.abstractmethod
    def destination(self, file: PathOrFile, max_json_bytes: int) -> Any:
        """What a load into "the writer of this file" expects of another file (the file is
        a reference checkpoint)."""

    @abc.abstractmethod
    def parse_destination(self, description: Mapping[str, Any], source: str) -> Any:
        """A destination from a JSON description's members (``tlckpt validate --against``;
        ``source`` names it in messages).

        Raises:
            MalformedError: a member is missing or not what it must be.
        """

    def examples(self) -> tuple[FamilyExample, ...]:
        """Valid files of the family written by its own writer, deterministically, each with
        its destination: the fuzzing campaigns seed from them (and from the conformance
        vectors), so a family registered with examples is fuzzed with no change there."""
        return ()

    def takes(self, target: Any) -> bool:
        """Whether this family's reader also checks files against ``target``, a destination
        another family made (either optimizer family's files load into an optimizer, so
        each takes the other's destinations). A family always takes its own."""
        return False

    @abc.abstractmethod
    def read(self, file: PathOrFile, target: Any, payloads: bool, max_json_bytes: int) -> Any:
        """Read the file the way a load into ``target`` does, raising what it raises.

        Payloads are skipped where the family allows it, unless ``payloads``; the result is
        what the family's reader returns.
        """


@dataclass(frozen=True)
class ModelStateFamily(FamilyHandler):
    """A family of model state: tensors by position, whatever their number and shapes.

    Every such family takes the same destinations
    (:class:`~tlckpt.codec.values.destinations.ModelStateTarget`: shapes and a scalar
    encoding), so a
    ``.pt`` or ``.safetensors`` model fits any of them, and ``tlckpt convert`` reads and
    writes them whole.

    Attributes:
        format: its name among the convertible formats (``--to``): ``"tlsf32"``, ``"json"``.
        extensions: file extensions that mean this format, lowercase with the dot.
        holds: the one scalar encoding the family holds (``"float32"``), or ``None`` when
            each file names its own (in its description's ``format``).
    """

    format: str = ""
    extensions: tuple[str, ...] = ()
    holds: str | None = None

    def destination(self, file: PathOrFile, max_json_bytes: int) -> ModelStateTarget:
        info = self.describe(file, max_json_bytes)
        source = os.fspath(file) if isinstance(file, (str, os.PathLike)) else None
        return ModelStateTarget(_shapes(info), self.holds or info["format"], source)

    def parse_destination(self, description: Mapping[str, Any], source: str) -> ModelStateTarget:
        return parse_model_state_target(description, source, holds=self.holds)

    def read_arrays(
        self, file: PathOrFile, description: Mapping[str, Any], max_json_bytes: int
    ) -> tuple[list[np.ndarray], str]:
        """The tensors of a file whose :meth:`describe` dict is given, in the codec's array
        form, and their encoding."""
        target = ModelStateTarget(_shapes(description), self.holds or description["format"])
        encoding = self.holds or description["encoding"] or description["format"]
        return self.read(file, target, True, max_json_bytes), encoding

    @abc.abstractmethod
    def write_arrays(self, path: PathOrFile, arrays: Arrays, encoding: str, pretty: bool) -> None:
        """Write arrays of ``encoding``'s array dtype, atomically, each taken from ``arrays``
        as it is written; ``pretty`` asks for an indented layout where the family has one."""


def _shapes(description: Mapping[str, Any]) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(t["shape"]) for t in description["tensors"])


_HANDLERS: dict[str, FamilyHandler] = {}


def register_family(handler: FamilyHandler) -> FamilyHandler:
    """Register ``handler``; families are tried and listed in registration order.

    Raises:
        ValueError: a family of that name is registered already, or a binary family's magic
            has no spec in :mod:`tlckpt.formats.registry`.
    """
    if not handler.name:
        raise ValueError(f"a family needs a name (its magic {handler.magic!r} has none)")
    if handler.name in _HANDLERS:
        raise ValueError(f"family {handler.name!r} is registered already")
    if handler.magic is not None and not registry.known_versions(handler.magic):
        raise ValueError(f"no version of {handler.magic!r} is registered in formats.registry")
    if handler.magic is None and type(handler).sniff is FamilyHandler.sniff:
        raise ValueError(f"family {handler.name!r} has neither a magic nor a sniff")
    _HANDLERS[handler.name] = handler
    if handler.magic is None:
        sniffing.add_sniffer(handler.name, handler.sniff)
    return handler


def unregister_family(name: str) -> None:
    """Remove a registration (tests that register a toy family clean up with this)."""
    _HANDLERS.pop(name, None)
    sniffing.remove_sniffer(name)


def families() -> tuple[FamilyHandler, ...]:
    """Every registered family, in registration order."""
    return tuple(_HANDLERS.values())


def family_named(name: str) -> FamilyHandler | None:
    """The family called ``name``, or ``None``."""
    return _HANDLERS.get(name)


def family_title(family: str) -> str:
    """The family as a noun phrase: ``"a TLSF32B file (float32 model state)"``."""
    handler = _HANDLERS.get(family)
    if handler is not None:
        return f"{handler.noun} ({handler.contents})"
    magic = next((m for m, f in registry.FAMILIES.items() if f == family), None)
    return f"a {magic.decode('ascii', 'replace') if magic else family} file"


def families_differ(
    found: str, expected: str | Sequence[str], destination: str | None = None
) -> UnsupportedFormatError:
    """The error for a file of family ``found`` where ``expected`` (one or several) was wanted.

    Args:
        found: the file's family, from its first bytes.
        expected: the family (or families) the reader or destination takes.
        destination: where the expectation came from (a reference file), for the message.

    Returns:
        An :class:`UnsupportedFormatError` saying the families differ; the caller raises it.
    """
    wanted = [expected] if isinstance(expected, str) else list(expected)
    others = " or ".join(family_title(f) for f in wanted)
    source = "" if destination is None else f" as the destination ({destination}) requires"
    return UnsupportedFormatError(
        f"the families differ: this is {family_title(found)}, not {others}{source}",
        field="magic",
        actual=found,
        expected=wanted[0] if len(wanted) == 1 else tuple(wanted),
    )

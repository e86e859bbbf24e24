"""Compiling a spec into a plan: the fast path derived from the declarative structs.

Each ``Struct`` becomes a tuple of steps, made once per spec and cached. Consecutive
fixed-size scalar fields (``FormatField``, ``Bytes(n)``, and ``Const`` / ``Valid`` wrapped
around them) are merged into one precompiled ``struct.Struct`` *run*, so a record header is
decoded with one ``unpack`` instead of one construct call per field. The checks that
``Const`` and ``Valid`` carry are kept, in order, and run on the unpacked values; when any
fails, the walker re-parses the run with construct's interpreted parser, which produces the
precise error. Nothing here restates a layout: every format string is read off the spec.
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from construct import (
    Array,
    Bytes,
    Const,
    Construct,
    Container,
    FormatField,
    IfThenElse,
    SizeofError,
    Struct,
)

from ...formats.primitives import Payload, Valid, unwrap

__all__ = [
    "CheckKind",
    "Check",
    "Run",
    "U64Array",
    "Records",
    "PayloadStep",
    "Branch",
    "Nested",
    "Leaf",
    "compile_struct",
    "child_context",
    "checks_pass",
    "header_format",
    "interpreted",
    "fast_path",
    "min_size",
    "has_payload",
    "fixed_size",
]


# Whether runs of fixed fields use the precompiled structs (the default) or construct's
# interpreted parser and builder field by field. Tests switch it off to show both agree.
_FAST_PATH: contextvars.ContextVar[bool] = contextvars.ContextVar("tlckpt_fast_path", default=True)


@contextlib.contextmanager
def interpreted() -> Iterator[None]:
    """Within this block, parse and build every field through construct's interpreter."""
    token = _FAST_PATH.set(False)
    try:
        yield
    finally:
        _FAST_PATH.reset(token)


def fast_path() -> bool:
    """Whether plans run on their precompiled structs here (not under :func:`interpreted`)."""
    return _FAST_PATH.get()


def fixed_size(sc: Construct) -> int | None:
    """Static byte size, or ``None`` if it depends on the data."""
    try:
        return sc.sizeof()
    except (SizeofError, KeyError, AttributeError, TypeError):
        return None


def min_size(sc: Construct) -> int:
    """Fewest bytes ``sc`` can occupy (arrays and payloads count as empty)."""
    sc = unwrap(sc)
    if isinstance(sc, Struct):
        return sum(min_size(s) for s in sc.subcons)
    if isinstance(sc, (Array, Payload)):
        return 0
    if isinstance(sc, IfThenElse):
        return min(min_size(sc.thensubcon), min_size(sc.elsesubcon))
    return fixed_size(sc) or 0


def has_payload(sc: Construct) -> bool:
    """Whether ``sc`` contains a payload (records of such arrays are streamed, not kept)."""
    sc = unwrap(sc)
    if isinstance(sc, Payload):
        return True
    if isinstance(sc, Struct):
        return any(has_payload(s) for s in sc.subcons)
    if isinstance(sc, Array):
        return has_payload(sc.subcon)
    if isinstance(sc, IfThenElse):
        return has_payload(sc.thensubcon) or has_payload(sc.elsesubcon)
    return False


class CheckKind(enum.Enum):
    """What a compiled check on an unpacked value compares it with."""

    CONST = "const"  #: the argument is the value a ``Const`` fixes
    VALID = "valid"  #: the argument is a ``Valid`` construct, whose ``check`` decides


#: A check on an unpacked value: ``(CheckKind.CONST, expected)`` or
#: ``(CheckKind.VALID, Valid construct)``.
Check = tuple[CheckKind, Any]


def _scalar(sc: Construct) -> tuple[str, str, list[Check]] | None:
    """(byte order, struct code, checks inner-first) for a fixed scalar field, else None."""
    sc = unwrap(sc)
    if type(sc) is FormatField and sc.fmtstr[0] in "<>" and len(sc.fmtstr) == 2:
        return sc.fmtstr[0], sc.fmtstr[1], []
    if type(sc) is Bytes and isinstance(sc.length, int):
        return "", f"{sc.length}s", []
    check: Check
    if type(sc) is Const:
        check = (CheckKind.CONST, sc.value)
    elif type(sc) is Valid:
        check = (CheckKind.VALID, sc)
    else:
        return None
    inner = _scalar(sc.subcon)
    return None if inner is None else (inner[0], inner[1], [*inner[2], check])


@dataclass(frozen=True)
class Run:
    """Consecutive fixed scalar fields decoded by one precompiled ``struct.Struct``."""

    names: tuple[str | None, ...]
    codec: struct.Struct
    checks: tuple[tuple[Check, ...], ...]
    sizes: tuple[int, ...]
    subcons: tuple[Construct, ...]  # for the interpreted re-diagnosis
    codes: tuple[str, ...] = ()  # each field's struct code, without the byte order


@dataclass(frozen=True)
class U64Array:
    """An array of fixed-size numbers (dims, tags): one ``unpack`` of count items."""

    name: str | None
    count: Any
    order: str
    code: str
    itemsize: int


@dataclass(frozen=True)
class Records:
    """An array of sub-structs, visited one record at a time."""

    name: str | None
    count: Any
    item: Any  # compiled plan of the item
    min_size: int
    streamed: bool  # holds payloads: records are not kept
    prefix: int  # steps of a Nested item before its first payload (the record's header)
    header: tuple[tuple[str | None, bool], ...] = ()  # (field, is an array) of that header
    # After the header, only payloads of a fixed dtype whose counts need nothing but the
    # record's own fields: a reader that knows the header can skip building a context.
    simple_tail: bool = False


@dataclass(frozen=True)
class PayloadStep:
    name: str | None
    payload: Payload


@dataclass(frozen=True)
class Branch:
    name: str | None
    cond: Callable[[Any], Any] | bool
    then: Any
    otherwise: Any


@dataclass(frozen=True)
class Nested:
    """A sub-struct field."""

    name: str | None
    struct: Struct
    steps: tuple


@dataclass(frozen=True)
class Leaf:
    """Anything else: decoded by construct itself."""

    name: str | None
    subcon: Construct
    size: int | None


def child_context(st: Struct, parent: Container, parsing: bool) -> Container:
    """The context construct's own ``Struct`` makes for ``st``, so ``this`` lambdas
    evaluate alike on every path."""
    ctx = Container(
        _=parent,
        _params=parent._params,
        _root=None,
        _parsing=parsing,
        _building=not parsing,
        _sizing=False,
        _subcons=st._subcons,
        _io=None,
        _index=parent.get("_index", None),
    )
    ctx._root = parent.get("_root", ctx)
    return ctx


_CONST = CheckKind.CONST  # a module global: cheaper to reach than the enum's attribute


def checks_pass(checks: tuple[Check, ...], value: Any, ctx: Container) -> bool:
    """Whether ``value`` passes a field's compiled checks (inner first, as construct runs
    them); a check that cannot even run on the value fails."""
    for kind, arg in checks:
        if kind is _CONST:
            if value != arg:
                return False
        else:
            try:
                if not arg.check(value, ctx):
                    return False
            except Exception:  # a check that cannot even run on this value fails
                return False
    return True


_CACHE: dict[int, tuple[Struct, tuple]] = {}


def compile_struct(st: Struct) -> tuple:
    """The cached plan of ``st``: a tuple of steps in field order."""
    hit = _CACHE.get(id(st))
    if hit is not None and hit[0] is st:
        return hit[1]
    steps: list[Any] = []
    pending: list[tuple[str | None, tuple[str, str, list[Check]], Construct]] = []

    def flush() -> None:
        if pending:
            order = pending[0][1][0] or "<"
            fmt = order + "".join(p[1][1] for p in pending)
            steps.append(
                Run(
                    tuple(p[0] for p in pending),
                    struct.Struct(fmt),
                    tuple(tuple(p[1][2]) for p in pending),
                    tuple(struct.calcsize("<" + p[1][1]) for p in pending),
                    tuple(unwrap(p[2]) for p in pending),
                    tuple(p[1][1] for p in pending),
                )
            )
            pending.clear()

    for sc in st.subcons:
        name = sc.name
        scalar = _scalar(sc)
        if scalar is not None:
            order = scalar[0]
            if pending and order and (pending[0][1][0] or order) != order:
                flush()
            pending.append((name, scalar, sc))
            continue
        flush()
        steps.append(_compile_field(name, sc))
    flush()
    plan = tuple(steps)
    _CACHE[id(st)] = (st, plan)
    return plan


def _compile_field(name: str | None, sc: Construct) -> Any:
    inner = unwrap(sc)
    if isinstance(inner, Struct):
        return Nested(name, inner, compile_struct(inner))
    if isinstance(inner, Array):
        item = unwrap(inner.subcon)
        if type(item) is FormatField and item.fmtstr[0] in "<>" and len(item.fmtstr) == 2:
            return U64Array(
                name, inner.count, item.fmtstr[0], item.fmtstr[1], struct.calcsize(item.fmtstr)
            )
        compiled = _compile_field(None, item)
        prefix = 0
        header: list[tuple[str | None, bool]] = []
        if isinstance(compiled, Nested):
            for step in compiled.steps:
                if isinstance(step, Run):
                    header.extend((n, False) for n in step.names)
                elif isinstance(step, U64Array):
                    header.append((step.name, True))
                else:
                    break
                prefix += 1
        tail = compiled.steps[prefix:] if isinstance(compiled, Nested) else ()
        simple_tail = bool(tail) and all(
            isinstance(t, PayloadStep) and t.payload.fixed_dtype is not None for t in tail
        )
        return Records(
            name,
            inner.count,
            compiled,
            min_size(item),
            has_payload(item),
            prefix,
            tuple(header),
            simple_tail,
        )
    if isinstance(inner, Payload):
        return PayloadStep(name, inner)
    if isinstance(inner, IfThenElse):
        return Branch(
            name,
            inner.condfunc,
            _compile_field(name, inner.thensubcon),
            _compile_field(name, inner.elsesubcon),
        )
    return Leaf(name, inner, fixed_size(inner))


def header_format(steps: tuple, values: dict[str, Any]) -> tuple[str, list[Any]]:
    """Struct format and flat values of a record header (the leading run/array steps) with
    the given field ``values`` (constant fields need none): lets a reader that knows what a
    header must be compare bytes instead of decoding fields. Raises ``KeyError``/``TypeError``
    if values are missing.
    """
    fmt = ["<"]
    flat: list[Any] = []
    for step in steps:
        if isinstance(step, Run):
            fmt.append(step.codec.format[1:])
            for name, checks in zip(step.names, step.checks):
                # A constant field (the magic, the version) has one possible value.
                const = [arg for kind, arg in checks if kind is CheckKind.CONST]
                flat.append(const[0] if const else values[name])
        elif isinstance(step, U64Array):
            items = list(values[step.name])
            fmt.append(f"{len(items)}{step.code}")
            flat.extend(items)
        else:
            break
    return "".join(fmt), flat

"""Any ``torch.optim`` optimizer's state ↔ an optimizer-tree file
(:mod:`tlckpt.formats.optimizer_tree`): the save, and the load as a plan committed after.

Every optimizer that is not Adam/AdamW goes here (SGD, Adagrad, Adadelta, Adamax, ASGD, NAdam,
RAdam, RMSprop, Rprop, Adafactor, Muon, LBFGS, SparseAdam, and any ``Optimizer`` subclass whose
state and group options are tensors, JSON values, and lists/tuples/dicts of them). Parameters
are named after the module's ``named_parameters()`` (a tied parameter once, by its first
name), so a file is tied to names, not positions: a renamed parameter with the same shape is
refused.

Saving checks everything (each managed parameter among the named ones, each value held
exactly, each tensor dense and local) before the first byte is written, then streams one
tensor at a time (a device tensor is copied to the host when its turn comes).

Loading reads and checks the whole file into new tensors first: the optimizer's class, its
groups (which names in which group, in order, with their dtypes and shapes), each state
entry's keys and the kinds of its values against the others of its group and against the
live optimizer's state where it has one (shapes and dtypes of tensors too), and the random
counter. The replacement state and group options are built off to the side; the plan's
commit then swaps the state in and updates the groups in one block under the project's
Ctrl-C deferral (:func:`~.plans.committing`). Group options come from the file (as torch's
``load_state_dict`` has them) for the keys the live group has; the execution flags
(``foreach``, ``fused``, ``capturable``, ``differentiable``) and ``param_names`` stay the live
run's. A state tensor goes where the live optimizer keeps its counterpart, when it has state
for the parameter already (Adagrad makes it at construction; a run resumed in process);
otherwise to its parameter's device, except ``step`` where the group is neither
``capturable`` nor ``fused`` (torch keeps it on the CPU then). Each keeps the dtype the file
holds: nothing is cast, so a resume is bit-exact.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ...codec.errors import (
    CheckpointError,
    ConfigError,
    SchemaMismatchError,
    UnsupportedFormatError,
)
from ...codec.families import family_title
from ...codec.fileio.source import PathOrFile, open_source
from ...codec.inspection import sniff_family
from ...codec.optimizers.optimizer_tree import (
    GroupRecord,
    TreeDocument,
    build_document,
    has_document,
    is_placeholder,
    parse_document,
    placeholder,
)
from ...codec.optimizers.optimizer_tree_family import OptimizerTreeTarget, check_against
from ...codec.safetensors.family import SAFETENSORS_FAMILY
from ...codec.safetensors.reader import read_header
from ...codec.safetensors.writer import write_safetensors
from ...formats.optimizer_tree import (
    EXECUTION_FLAGS,
    FAMILY,
    GROUP_PREFIX,
    NAMES_KEY,
    SEPARATOR,
    STATE_PREFIX,
    VERSION,
)
from ..binding.slots import ModuleOrParams, named_tensors
from ..commit.plans import OptimizerPlan, committing, install_state
from .optimizer_tree_checks import check_entries, check_form, check_live
from .tensor_files import dtype_word, read_entry, tensor_data

__all__ = ["save", "plan_load", "TreePlan", "class_name", "parameter_names"]

#: State keys torch keeps on the CPU unless the group is capturable or fused.
_HOST_STEP_KEYS = ("step",)


def class_name(optimizer: torch.optim.Optimizer) -> str:
    """The optimizer's ``module.qualname`` (what a file records and a load compares)."""
    kind = type(optimizer)
    return f"{kind.__module__}.{kind.__qualname__}"


def _require_local(t: torch.Tensor, name: str, what: str) -> None:
    """Refuse a tensor that is not dense and local (a DTensor, a sparse tensor): ``what`` is
    the message's start, naming it."""
    if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.layout != torch.strided:
        raise CheckpointError(
            f"{what} is a {type(t).__name__} of layout {t.layout}: optimizer trees hold dense"
            " local tensors (sharded ones are not supported yet)",
            field=name,
            actual=type(t).__name__,
        )


def parameter_names(module_or_params: ModuleOrParams) -> dict[int, str]:
    """``id(parameter)`` → its name: the module's ``named_parameters()`` (a tied parameter
    by its first name), a mapping's keys, or ``params[i]`` for a sequence.

    Raises:
        CheckpointError: a parameter that is not a dense local tensor (a DTensor: sharded
            optimizer trees are not written yet).
        TypeError: an entry that is not a tensor.
    """
    items = named_tensors(
        module_or_params,
        lambda module: module.named_parameters(remove_duplicate=False),
        "params",
        lambda name, value: TypeError(f"{name} is a {type(value).__name__}, not a tensor"),
    )
    names: dict[int, str] = {}
    for name, t in items:
        _require_local(t, name, f"parameter {name!r}")
        names.setdefault(id(t), name)
    return names


def _live_groups(
    optimizer: torch.optim.Optimizer, names: dict[int, str]
) -> list[list[tuple[str, torch.Tensor]]]:
    """Each group's ``(name, parameter)`` in order.

    Raises:
        SchemaMismatchError: a managed parameter that is not among the named ones, or one
            managed twice.
    """
    out, seen = [], set()
    for g, group in enumerate(optimizer.param_groups):
        members = []
        for k, p in enumerate(group["params"]):
            name = names.get(id(p))
            if name is None:
                raise SchemaMismatchError(
                    f"the optimizer manages param_groups[{g}]['params'][{k}] (shape"
                    f" {tuple(p.shape)}), which is not among the given parameters",
                    field=f"param_groups[{g}].params[{k}]",
                )
            if name in seen:
                raise SchemaMismatchError(
                    f"the optimizer manages {name!r} twice", field=f"param_groups[{g}]"
                )
            seen.add(name)
            members.append((name, p))
        out.append(members)
    return out


def _described(members: list[tuple[str, torch.Tensor]]) -> tuple[tuple[str, str, tuple], ...]:
    return tuple((n, dtype_word(p.dtype, n), tuple(p.shape)) for n, p in members)


class _Tensors:
    """The file's tensors as they are collected: each gets a name and a placeholder."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.tensors: list[torch.Tensor] = []
        self.taken: set[str] = set()

    def collect(self, value: Any, name: str) -> Any:
        """``value`` with each tensor replaced by its placeholder (containers rebuilt)."""
        if isinstance(value, torch.Tensor):
            _require_local(value, name, repr(name))
            if name in self.taken:
                raise ConfigError(
                    f"two tensors of the state would both be named {name!r} (a parameter name"
                    f" holding {SEPARATOR!r}?)",
                    field=name,
                )
            self.taken.add(name)
            self.names.append(name)
            self.tensors.append(value.detach())
            return placeholder(len(self.tensors) - 1)
        kind = type(value)
        if kind in (list, tuple):
            return kind(self.collect(v, f"{name}{SEPARATOR}{i}") for i, v in enumerate(value))
        if kind is dict:
            return {k: self.collect(v, f"{name}{SEPARATOR}{k}") for k, v in value.items()}
        return value  # a JSON value, or what encode_value refuses, naming its path


def save(
    optimizer: torch.optim.Optimizer,
    module_or_params: ModuleOrParams,
    path: PathOrFile,
    *,
    random_counter: int | None,
    require_torchlean: bool = False,
) -> int:
    """Write the optimizer's state as an optimizer tree (see
    :func:`~tlckpt.runtime.save_optimizer`).

    Returns:
        The document version written (:data:`~tlckpt.formats.optimizer_tree.VERSION`).

    Raises:
        ConfigError: ``require_torchlean`` (TorchLean reads Adam/AdamW only), a random
            counter that is not a non-negative integer, two tensors of one name.
        SchemaMismatchError: a managed parameter not among the named ones; state for a
            parameter no group manages.
        CheckpointError: a value the file cannot hold exactly (named by its path); a
            parameter or state tensor that is not dense and local. All before any write.
        OSError: from the file system; the previous file is untouched.
    """
    if require_torchlean:
        raise ConfigError(
            f"{type(optimizer).__name__} state cannot be written in a file TorchLean reads"
            " (TorchLean's optimizer files hold Adam/AdamW state only)",
            field="require_torchlean",
            actual=type(optimizer).__name__,
        )
    if random_counter is not None and (type(random_counter) is not int or random_counter < 0):
        raise ConfigError(
            f"random_counter must be a non-negative integer, not {random_counter!r}",
            field="random_counter",
            actual=random_counter,
        )
    names = parameter_names(module_or_params)
    live = _live_groups(optimizer, names)
    managed = {id(p) for members in live for _, p in members}
    stray = [k for k in optimizer.state if id(k) not in managed]
    if stray:
        raise SchemaMismatchError(
            f"the optimizer holds state for {len(stray)} tensor(s) no param group manages",
            field="state",
            actual=len(stray),
        )
    tensors = _Tensors()
    groups, state = [], {}
    for g, (group, members) in enumerate(zip(optimizer.param_groups, live)):
        bad = [k for k in group if type(k) is not str]
        if bad:
            raise ConfigError(
                f"param_groups[{g}] has a key that is not a string: {bad[0]!r}",
                field=f"param_groups[{g}]",
            )
        options = {
            key: tensors.collect(value, f"{GROUP_PREFIX}{g}{SEPARATOR}{key}")
            for key, value in group.items()
            if key not in ("params", NAMES_KEY)
        }
        groups.append(GroupRecord(_described(members), options))
        for name, p in members:
            entry = optimizer.state.get(p)
            if entry is None:  # an empty entry is kept: torch's state_dict lists it too
                continue
            bad = [k for k in entry if type(k) is not str]
            if bad:
                raise ConfigError(
                    f"the state of {name!r} has a key that is not a string: {bad[0]!r}",
                    field=name,
                )
            prefix = f"{STATE_PREFIX}{name}{SEPARATOR}"
            state[name] = {k: tensors.collect(v, f"{prefix}{k}") for k, v in entry.items()}
    metadata = build_document(class_name(optimizer), tensors.names, groups, state, random_counter)
    items = {n: tensor_data(t, n) for n, t in zip(tensors.names, tensors.tensors)}
    write_safetensors(path, items, metadata=metadata)
    return VERSION


class TreePlan(OptimizerPlan):
    """An optimizer tree's replacement state and group options, checked, waiting for the
    commit.

    Args:
        optimizer: the live optimizer.
        state: its new state, keyed by parameter.
        options: per group, the keys to set and their values.
        random_counter: the file's random counter, or ``None``.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        state: dict[torch.Tensor, dict],
        options: list[dict[str, Any]],
        random_counter: int | None,
    ):
        super().__init__(optimizer, state, random_counter)
        self.options = options

    def commit(self) -> None:
        """Swap the state in and set the groups' options: dictionary operations only, all
        under one deferral of Ctrl-C."""
        with committing():
            install_state(self.optimizer, self.state)
            for group, values in zip(self.optimizer.param_groups, self.options):
                group.update(values)


def _placed(value: Any, tensors: list[torch.Tensor], device: torch.device) -> Any:
    """A decoded value with placeholders replaced by the file's tensors on ``device``."""
    if is_placeholder(value):
        return tensors[value.value].to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(_placed(v, tensors, device) for v in value)
    if type(value) is dict:
        return {k: _placed(v, tensors, device) for k, v in value.items()}
    return value


def _read_document(
    path: PathOrFile,
    optimizer: torch.optim.Optimizer,
    check: Callable[[TreeDocument], None],
) -> tuple[TreeDocument, list[torch.Tensor]]:
    """The file's document, checked whole and by ``check`` before any tensor is read, and
    every tensor it lists, in its order (read in file order, each into a fresh CPU tensor)."""
    with open_source(path) as src:
        family = sniff_family(src.file)
        # A tree rewritten by another tool (its header reordered) is not told from its head
        # (it sniffs as plain safetensors), and is read all the same when its metadata holds
        # the document.
        if family not in (FAMILY, SAFETENSORS_FAMILY.name):
            raise ConfigError(
                f"the file is {family_title(family)}; the optimizer is"
                f" {type(optimizer).__name__}, whose state is an optimizer tree",
                field="family",
                actual=family,
                expected=FAMILY,
            )
        header = read_header(src)
        if not has_document(header):
            raise UnsupportedFormatError(
                "the file is a safetensors file without an optimizer tree: not an optimizer"
                " checkpoint",
                field="__metadata__",
            )
        document = parse_document(header)
        check(document)
        entries = [header.entries[n] for n in document.tensors]
        order = sorted(range(len(entries)), key=lambda i: entries[i].begin)
        tensors: list[Any] = [None] * len(entries)
        for i in order:
            tensors[i] = read_entry(src, header, entries[i])
    return document, tensors


def plan_load(
    optimizer: torch.optim.Optimizer,
    module_or_params: ModuleOrParams,
    path: PathOrFile,
    restore_random_counter: bool,
) -> TreePlan:
    """Read and check an optimizer tree and build the replacement state (see
    :func:`~tlckpt.runtime.load_optimizer`); nothing live changes.

    Raises:
        UnsupportedFormatError: not an optimizer tree (the family it is, named).
        ConfigError: another optimizer class; a random counter nobody asked for.
        SchemaMismatchError: other groups (names, order, dtypes, shapes), state keys that
            differ within a group or from the live optimizer's.
        CheckpointError: any other rejection of the file.
    """
    names = parameter_names(module_or_params)
    live = _live_groups(optimizer, names)

    def check(document: TreeDocument) -> None:
        if document.optimizer_class != class_name(optimizer):
            raise ConfigError(
                f"the file holds {document.optimizer_class} state; the optimizer is"
                f" {class_name(optimizer)}",
                field="class",
                actual=document.optimizer_class,
                expected=class_name(optimizer),
            )
        target = OptimizerTreeTarget(class_name(optimizer), tuple(_described(m) for m in live))
        check_against(document, target)
        if document.random_counter is not None and not restore_random_counter:
            raise ConfigError(
                f"the file holds a random counter ({document.random_counter}) and the caller"
                " has nowhere to put it; pass restore_random_counter=True and restore it",
                field="random_counter",
                actual=document.random_counter,
            )
        check_entries(document)

    document, tensors = _read_document(path, optimizer, check)
    state: dict[torch.Tensor, dict] = {}
    options: list[dict[str, Any]] = []
    for group, members, record in zip(optimizer.param_groups, live, document.groups):
        on_device = bool(group.get("capturable")) or bool(group.get("fused"))
        for name, p in members:
            entry = document.state.get(name)
            if entry is None:
                continue
            new = {}
            for key, value in entry.items():
                host = key in _HOST_STEP_KEYS and not on_device
                new[key] = _placed(value, tensors, torch.device("cpu") if host else p.device)
            live_entry = optimizer.state.get(p)
            if live_entry and new:
                check_live(name, new, live_entry)
                for key, value in new.items():  # the live optimizer's own form, where known
                    held = live_entry[key]
                    if isinstance(value, torch.Tensor) and isinstance(held, torch.Tensor):
                        new[key] = value.to(held.device)
            state[p] = new
        values = {}
        for key, value in record.options.items():
            if key in group and key not in (*EXECUTION_FLAGS, NAMES_KEY, "params"):
                current = group[key]
                device = current.device if isinstance(current, torch.Tensor) else "cpu"
                values[key] = _placed(value, tensors, torch.device(device))
                check_form(values[key], current, f"param_groups[{len(options)}].{key}")
        options.append(values)
    return TreePlan(optimizer, state, options, document.random_counter)

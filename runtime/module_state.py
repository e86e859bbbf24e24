"""Model state (parameters and persistent buffers) ↔ ``TLSF32B``, exact-bits JSON and the
safetensors layout (by name, any dtype: :mod:`.named_module_state`).

The public functions: each chooses the placement of the caller's tensors (one process, or
DTensors across ranks: :func:`~.placement.placement_for`) and runs the operation written
once over it: :mod:`.float32_files` (``TLSF32B``), :mod:`.bits_files` (exact-bits JSON) and,
for a sharded model's safetensors file, :mod:`.sharded_named_state`.
A load is planned (read and checked off to the side), then committed (:mod:`.plans`).

State is ``state_dict()`` order: parameters (tied ones once per place they are registered,
frozen ones included) and persistent buffers, without names (FORMAT.md §4;
:mod:`.state_tensors`). The file's scalar type is the model's one floating dtype; an integer
or bool tensor (BatchNorm's ``num_batches_tracked``) travels in it only when the conversion is
exact both ways.

Loading is all or nothing. The default load of a path first takes a read lease on the file
(:mod:`~tlckpt.codec.fileio.leases`; Linux): while it is held nobody can open the file for
writing, so once the whole file is checked its payloads are read straight into the live
tensors. Where no lease is granted it stages: it reads and checks the whole file into fresh
host memory, verifies the file did not change meanwhile, and only then copies every value
into its live tensor. Either way device, dtype and storage stay (tied parameters stay tied,
optimizers keep pointing at the same tensors), and Ctrl-C is held back until the copies are
done. The in-place load (``staged=False``) checks the whole file first, then reads each
payload straight into its tensor: no copy of the state, but a file changed or truncated by
another process during that pass leaves a partial update, reported as
:class:`~tlckpt.codec.errors.PartialLoadError`.
"""

from __future__ import annotations

import io
import os

from ..codec.errors import CheckpointError, names_the_file
from ..codec.families import family_title
from ..codec.fileio.gcpause import without_gc
from ..codec.fileio.source import PathOrFile, open_regular
from ..codec.sniffing import HEAD_BYTES, JSON_FAMILY, head_family
from .binding.dtensors import reusable
from .ops import bits_files, float32_files, sharded_named_state
from .ops.named_module_state import plan_named_load
from .ops.state_tensors import ModuleOrTensors
from .placement.choice import placement_for
from .placement.local_placement import LOCAL

__all__ = [
    "module_format",
    "save_module_state",
    "load_module_state",
    "save_state_bits",
    "load_state_bits",
]


SAFETENSORS = "safetensors"
JSON = JSON_FAMILY
TLSF32 = "float32_state"
#: ``format=`` words → families.
_FORMATS = {"safetensors": SAFETENSORS, "json": JSON, "tlsf32": TLSF32}
#: Suffixes that choose a family when ``format`` is ``None``.
_SUFFIXES = {".safetensors": SAFETENSORS, ".json": JSON}


def module_format(path: PathOrFile, format: str | None) -> str:
    """The family :func:`save_module_state` writes: ``format``'s, else the path's suffix's
    (``TLSF32B`` for any other suffix and for file objects).

    Raises:
        ValueError: an unknown ``format``.
    """
    if format is not None:
        if format not in _FORMATS:
            raise ValueError(f"format must be one of {sorted(_FORMATS)}, not {format!r}")
        return _FORMATS[format]
    if isinstance(path, (str, os.PathLike)):
        return _SUFFIXES.get(os.path.splitext(os.fspath(path))[1].lower(), TLSF32)
    return TLSF32


def _named_family(path: PathOrFile) -> str:
    """The family of the file, from its first bytes, to route the load; a file of no family
    goes to the ``TLSF32B`` reader, which says precisely what is wrong with it.

    Only routing: the chosen reader opens and checks the file itself (its stamps, from its
    own first ``fstat``, are what detect a change), so this peek is no
    :class:`~tlckpt.codec.source.Source` and needs no stamp of its own.
    """
    if isinstance(path, (str, os.PathLike)):
        with open_regular(path) as f:  # a FIFO or a device is refused, never waited on
            head = f.read(HEAD_BYTES)
            remaining = os.fstat(f.fileno()).st_size
    else:
        try:
            start = path.tell()
            head = path.read(HEAD_BYTES)
            remaining = path.seek(0, os.SEEK_END) - start
            path.seek(start)
        except (AttributeError, io.UnsupportedOperation):  # the reader says what it needs
            return TLSF32
    return head_family(head, remaining) or TLSF32


@names_the_file()
@without_gc
def save_module_state(
    module_or_tensors: ModuleOrTensors, path: PathOrFile, *, format: str | None = None
) -> None:
    """Write a model's state (atomically for a path): a float32 model as a ``TLSF32B`` file,
    any model in the safetensors layout or as exact-bits JSON.

    The family is ``format`` (``"tlsf32"``, ``"safetensors"``, ``"json"``) or, when it is
    ``None``, the path's suffix: ``.safetensors`` is the safetensors layout (any dtype; tied
    tensors once, the other names in ``__metadata__``: :mod:`.named_module_state`),
    ``.json`` is exact-bits JSON (:func:`save_state_bits`), anything else (and a file
    object) ``TLSF32B``, as before.

    Tensors are written one at a time; device tensors pass through one reusable (pinned)
    host buffer, so no more than one tensor's payload is held beyond the model.

    A model holding DTensors (FSDP2 ``fully_shard``, ``distribute_tensor``) makes this a
    collective: every rank calls it and rank 0 alone opens the file (see
    :mod:`tlckpt.runtime.placement.sharded_placement`); errors are then raised on every rank alike.

    Args:
        module_or_tensors: an ``nn.Module`` (``state_dict`` order) or a sequence of tensors.
        path: destination path, or a binary file object written at its position.
        format: the family, or ``None`` for the path's suffix.

    Raises:
        ConfigError: for ``TLSF32B``, the model is not float32, mixes floating dtypes, or
            has an integer tensor that float32 cannot hold exactly (the message names it);
            for safetensors, a dtype the layout lacks. Checked before the first byte is
            written.
        ValueError: an unknown ``format``.
        OSError: from the file system.

    Example:
        >>> save_module_state(model, "model.tlsf32")           # doctest: +SKIP
        >>> save_module_state(bf16_model, "model.safetensors")  # doctest: +SKIP
    """
    module_or_tensors = reusable(module_or_tensors)
    family = module_format(path, format)
    if family == SAFETENSORS:  # a sharded model's: every rank its own bytes, collectively
        sharded_named_state.save(placement_for(module_or_tensors), module_or_tensors, path)
        return
    if family == JSON:
        bits_files.save(placement_for(module_or_tensors), module_or_tensors, path, True)
        return
    float32_files.save(placement_for(module_or_tensors), module_or_tensors, path)


@names_the_file()
@without_gc
def load_module_state(
    module_or_tensors: ModuleOrTensors,
    path: PathOrFile,
    *,
    staged: bool = True,
    strict: bool = True,
) -> tuple[list[str], list[str]] | None:
    """Load model state, in place, all or nothing; the family is read from the file's first
    bytes.

    A safetensors file is loaded by name (:mod:`.named_module_state`): ``strict=False``
    loads the tensors whose names the model has and returns ``(missing, unexpected)`` like
    ``torch``'s ``load_state_dict`` (with ``strict=True`` a difference in names is refused);
    dtypes and shapes must be equal; the load is always staged. An exact-bits JSON file is
    loaded as :func:`load_state_bits` does. What follows is the ``TLSF32B`` load, which
    returns ``None``.

    One open handle serves every pass. The first checks the whole file (tensor count, every
    shape, sizes, the end of file) without touching the model. Then:

    * ``staged=True`` (the default), for a path on which this process gets a read lease
      (Linux; nobody has the file open for writing; the process owns the file or has
      ``CAP_LEASE``; a file system that grants leases): the lease is taken before the first
      pass, so no other process can open the file for writing or truncate it until the
      load ends (such an ``open`` waits). The checks of ``staged=False``'s checking pass run
      (integer values, tied copies compared in the file), then the payloads are read
      straight into the live tensors with Ctrl-C held back: no copy of the state. A read
      error of the disk during that copy (or a writer that waited longer than the kernel's
      lease-break time) is a :class:`PartialLoadError`.
    * ``staged=True`` where no lease is granted (or for a file object): every payload is read
      into fresh host memory, where
      integer tensors' values are checked to convert exactly and the copies of a tied
      tensor to agree; the file is checked not to have changed since the first pass began;
      only then is every value copied into its live tensor, with Ctrl-C held back until the
      last copy is done. Whatever fails or interrupts the load — a bad or truncated file,
      another process rewriting it, ``KeyboardInterrupt`` — the model holds either all of its
      previous values or all of the file's. Costs one transient copy of the state in host
      memory (plus one tensor's payload for tied or integer tensors).
    * ``staged=False``: a checking pass reads only what the first could not check (integer
      tensors, tied copies); the copying pass then reads each payload straight into its
      tensor when it is a contiguous CPU float32 tensor, else through one reusable (pinned)
      host buffer: at most one tensor's payload of extra memory. Ctrl-C is held back for
      the whole copying pass. If the file changes or fails to read *during* that pass, the
      model is partially updated and :class:`PartialLoadError` says so.

    A model holding DTensors (FSDP2 ``fully_shard``, ``distribute_tensor``) makes this a
    collective: every rank calls it and rank 0 alone opens the file (see
    :mod:`tlckpt.runtime.placement.sharded_placement`); errors are then raised on every rank
    alike. Such
    loads are always staged (each rank keeps its new shards off to the side until all have
    arrived), whatever ``staged`` says.

    Args:
        module_or_tensors: the destination model or tensors (``state_dict`` order).
        path: file path, or a seekable binary file object read from its position.
        staged: stage the whole state before writing any of it (all or nothing, one copy
            of the state), or copy in place (bounded memory).
        strict: for files with names (safetensors): refuse a difference in names, or load
            what both have. Positional files (TLSF32B, JSON) take ``strict=True`` only.

    Returns:
        For a safetensors file, ``(missing, unexpected)``: model names the file did not
        give, file names the model does not have. ``None`` for the positional families.

    Raises:
        CheckpointError: the file does not fit the model (a subclass naming the tensor,
            offset and values), holds different values for tied copies, or the model is not
            float32; the model is unchanged.
        FileChangedError: another process changed the file during the load; the model is
            unchanged.
        PartialLoadError: with ``staged=False``: the file changed, was truncated or could
            not be read after live tensors had been overwritten; under a read lease: a read
            failed, or a writer outwaited the lease, during the copy. The message says how
            many tensors were overwritten, and ``__cause__`` why.
        OSError: from the file system; the model is unchanged (with ``staged=False``, an
            ``OSError`` during the copying pass becomes a :class:`PartialLoadError`).

    Example:
        >>> load_module_state(model, "model.tlsf32")           # doctest: +SKIP
    """
    module_or_tensors = reusable(module_or_tensors)
    family = _named_family(path)
    if family == SAFETENSORS:
        placement = placement_for(module_or_tensors)
        if placement is not LOCAL:  # a sharded model: strictly, every rank its own bytes
            if not strict:
                raise CheckpointError(
                    "strict=False is not supported for a sharded (DTensor) model",
                    field="strict",
                )
            with sharded_named_state.plan_load(placement, module_or_tensors, path) as plan:
                plan.commit()
            return [], []
        plan, missing, unexpected = plan_named_load(
            module_or_tensors, path, strict=strict, lease=True
        )
        with plan:  # a leased plan holds the file until its commit is done
            plan.commit()
        return missing, unexpected
    if not strict:
        raise CheckpointError(
            f"strict=False loads files with names (safetensors); this is {family_title(family)},"
            " whose tensors are known by position only",
            field="strict",
            actual=family,
        )
    placement = placement_for(module_or_tensors)
    if family == JSON:
        bits_files.plan_load(placement, module_or_tensors, path).commit()
        return None
    with float32_files.plan_load(
        placement, module_or_tensors, path, staged=staged, lease=True
    ) as plan:
        plan.commit()
    return None


@names_the_file()
@without_gc
def save_state_bits(
    module_or_tensors: ModuleOrTensors, path: PathOrFile, *, pretty: bool = True
) -> None:
    """Write the model's state as exact-bits JSON in the model's own floating dtype.

    Every word is kept, NaN payloads and subnormals included. The encoding follows the
    dtype: float64, float32, float16, bfloat16, the float8 kinds, complex32/64/128 (a model
    without floating tensors uses float64).

    A model holding DTensors (FSDP2 ``fully_shard``, ``distribute_tensor``) makes this a
    collective: every rank calls it and rank 0 alone opens the file (see
    :mod:`tlckpt.runtime.placement.sharded_placement`); errors are then raised on every rank alike.

    Args:
        module_or_tensors: an ``nn.Module`` (``state_dict`` order) or a sequence of tensors.
        path: destination path (written atomically) or a binary file object.
        pretty: indented JSON (default) or compact.

    Raises:
        ConfigError: mixed floating dtypes, a dtype no format holds, or an integer tensor
            whose values the file's type cannot hold exactly (the message names it).
        OSError: from the file system.
    """
    module_or_tensors = reusable(module_or_tensors)
    bits_files.save(placement_for(module_or_tensors), module_or_tensors, path, pretty)


@names_the_file()
@without_gc
def load_state_bits(
    module_or_tensors: ModuleOrTensors, path: PathOrFile, *, staged: bool = True
) -> None:
    """Load exact-bits JSON state into the model in place, all or nothing.

    The expected format tag follows the model's floating dtype. The whole file is read at
    once, checked not to have changed while it was read, parsed and checked, and every
    value converted for its destination, before any tensor is written; then every value is
    copied into its live tensor with Ctrl-C held back until the last copy is done. A JSON
    document must be parsed whole, so this load is always staged: ``staged`` is accepted
    for symmetry with :func:`load_module_state` and ``staged=False`` changes nothing (it
    neither saves memory nor weakens the guarantee).

    A model holding DTensors (FSDP2 ``fully_shard``, ``distribute_tensor``) makes this a
    collective: every rank calls it and rank 0 alone opens the file (see
    :mod:`tlckpt.runtime.placement.sharded_placement`); errors are then raised on every rank alike.

    Args:
        module_or_tensors: the destination model or tensors.
        path: file path or a binary file object.
        staged: accepted for symmetry; JSON loads are always staged.

    Raises:
        CheckpointError: the file does not fit (wrong tag, counts, shapes, words, or a value
            that does not convert exactly into an integer tensor); the model is unchanged.
        FileChangedError: another process changed the file while it was read; the model
            is unchanged.
        OSError: from the file system; the model is unchanged.
    """
    module_or_tensors = reusable(module_or_tensors)
    bits_files.plan_load(placement_for(module_or_tensors), module_or_tensors, path).commit()

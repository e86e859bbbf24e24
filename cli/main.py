"""The command line: ``python -m tlckpt`` / ``tlckpt``.

Commands (no command at all runs ``demo``)::

    tlckpt inspect FILE [--json] [--max-json-bytes SIZE]
    tlckpt validate FILE [--against REFERENCE_OR_DESCRIPTION] [--max-json-bytes SIZE]
    tlckpt convert SRC DST [--to FORMAT] [--dtype ENCODING] [--names-from FILE] [--compact]
                   [--max-json-bytes SIZE]
    tlckpt demo [--codec] [--keep DIR]
    tlckpt ls DIR [--key-file FILE] [--storage-options JSON]
    tlckpt verify PATH [--key-file FILE] [--storage-options JSON]
    tlckpt export-hf SRC OUT [--max-shard-size SIZE] [--model KEY] [--key-file FILE]
    tlckpt import-hf HF_DIR OUT

Exit status: 0 success; 1 the file was rejected or the command failed (one line on stderr
naming the error class, the file, the byte offset or field, and the file vs expected values —
never a traceback); 2 a usage error; 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
from collections.abc import Callable, Sequence

from ..codec import DEFAULT_MAX_JSON_BYTES, CheckpointError, inspect, read_key_file
from ..formats.state_bits import ENCODINGS, encoding_by_name
from ..optional import MissingDependencyError, require
from .convert import EXTENSIONS, FORMATS, POSITIONAL, convert, format_of_path
from .describe import describe, summarize
from .file_formats import POSITIONAL_FAMILIES
from .hugging_face import export_hf_folder, import_hf_folder
from .printable import printable
from .set_description import describe_set, set_description
from .sets import list_sets, verify_set
from .validation import load_destination, validate

__all__ = ["main", "build_parser"]

EXIT_OK = 0
EXIT_REJECTED = 1
EXIT_USAGE = 2


class _UsageError(Exception):
    """A command line that cannot be run as given (exit status 2)."""


def _one_line(text: object) -> str:
    # Messages quote what files hold: their control characters are shown, never obeyed.
    return printable(" ".join(str(text).split()))


_SIZE = re.compile(r"\s*(\d+)\s*([a-z]*)\s*", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def byte_size(text: str) -> int:
    """``--max-json-bytes``: bytes, or a number with K, M, G, T (KiB, ... alike: powers of 2)."""
    match = _SIZE.fullmatch(text)
    unit = match.group(2).lower().removesuffix("ib").removesuffix("b") if match else None
    if match is None or unit not in _UNITS:
        raise argparse.ArgumentTypeError(
            f"not a size: {text!r} (bytes, or a number with K, M, G or T, e.g. 8G)"
        )
    return int(match.group(1)) * _UNITS[unit]


def _cmd_inspect(args: argparse.Namespace) -> int:
    if os.path.isdir(args.file):  # a checkpoint set: its members, from its manifest
        try:
            info = set_description(args.file)
        except CheckpointError as exc:
            raise exc.with_path(args.file) from None
        print(json.dumps(info, indent=2) if args.json else describe_set(info, args.file))
        return EXIT_OK
    try:
        info = inspect(args.file, max_json_bytes=args.max_json_bytes)
    except CheckpointError as exc:
        raise exc.with_path(args.file) from None
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        print(describe(info, args.file))
    return EXIT_OK


def _cmd_validate(args: argparse.Namespace) -> int:
    against = None
    if args.against is not None:
        try:
            against = load_destination(args.against, max_json_bytes=args.max_json_bytes)
        except CheckpointError as exc:
            raise exc.with_path(args.against) from None
    try:
        info = validate(args.file, against, max_json_bytes=args.max_json_bytes)
    except CheckpointError as exc:
        raise exc.with_path(args.file) from None
    fits = "" if against is None else f"; fits {against.source}"
    print(f"{args.file}: ok ({summarize(info)}{fits})")
    return EXIT_OK


def _format_for(path: str, explicit: str | None, role: str) -> str:
    if explicit is not None:
        return explicit
    fmt = format_of_path(path)
    if fmt is None and path.lower().endswith(".tladam"):
        raise _UsageError(
            f"{path!r} is an optimizer file: convert converts model state (TLSF32B, JSON,"
            " safetensors, .pt); an optimizer's state is bound to its model's parameters:"
            " load it with load_optimizer and write it with save_optimizer (by file suffix:"
            " .tladam for Adam/AdamW, .safetensors for any optimizer)"
        )
    if fmt is None:
        known = ", ".join(EXTENSIONS)
        hint = " (or pass --to)" if role == "destination" else ""
        raise _UsageError(
            f"cannot tell the {role} format of {path!r} from its extension;"
            f" expected one of {known}{hint}"
        )
    return fmt


def _cmd_convert(args: argparse.Namespace) -> int:
    src_format = _format_for(args.src, None, "source")
    dst_format = _format_for(args.dst, args.to, "destination")
    # --dtype picks the scalar type of a family whose files each name their own.
    typed = [f.label for f in POSITIONAL_FAMILIES.values() if f.holds is None]
    family = POSITIONAL_FAMILIES.get(dst_format)
    if args.dtype is not None and (family is None or family.holds is not None):
        raise _UsageError(f"--dtype applies to {' or '.join(typed)} destinations only")
    if args.dtype is not None and encoding_by_name(args.dtype) is None:
        raise _UsageError(
            f"unknown --dtype {args.dtype!r}; expected one of {', '.join(ENCODINGS)}"
            " or a torchlean_state_*_v1 format tag"
        )
    if args.names_from is not None and {src_format, dst_format} <= POSITIONAL:
        raise _UsageError(
            "--names-from names the tensors of a positional source going to a named file, or"
            " orders a named source; neither file here has names"
        )
    try:
        result = convert(
            args.src,
            args.dst,
            src_format=src_format,
            dst_format=dst_format,
            encoding=args.dtype,
            names_from=args.names_from,
            pretty=not args.compact,
            max_json_bytes=args.max_json_bytes,
        )
    except CheckpointError as exc:
        raise exc.with_path(args.src) from None
    encoding = f" {result['encoding']}" if result["encoding"] else ""
    names = "" if result["names"] is None else f"; names {result['names']}"
    print(
        f"{args.src} ({result['source']}) -> {args.dst} ({result['target']}{encoding}):"
        f" {result['tensors']} tensor(s), exact{names}"
    )
    return EXIT_OK


def _key(args: argparse.Namespace) -> bytes | None:
    """The key of ``--key-file`` (``None`` without it); a file that is not a key is a usage
    error. The key's bytes are never printed."""
    if args.key_file is None:
        return None
    try:
        return read_key_file(args.key_file)
    except (CheckpointError, OSError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise _UsageError(f"--key-file {args.key_file}: {_one_line(reason)}") from None


def _storage_options(args: argparse.Namespace) -> dict | None:
    """The JSON object of ``--storage-options`` (``None`` without it); anything else is a
    usage error."""
    if args.storage_options is None:
        return None
    try:
        options = json.loads(args.storage_options)
    except ValueError as exc:
        raise _UsageError(f"--storage-options is not JSON: {_one_line(exc)}") from None
    if not isinstance(options, dict):
        raise _UsageError("--storage-options must be a JSON object")
    return options


def _cmd_ls(args: argparse.Namespace) -> int:
    print(list_sets(args.dir, key=_key(args), storage_options=_storage_options(args)))
    return EXIT_OK


def _cmd_verify(args: argparse.Namespace) -> int:
    key = _key(args)
    options = _storage_options(args)
    try:
        print(verify_set(args.path, key=key, storage_options=options))
    except CheckpointError as exc:
        raise exc.with_path(args.path) from None
    return EXIT_OK


def _cmd_demo(args: argparse.Namespace) -> int:
    if not args.codec:
        require("torch", "the training demo", "`tlckpt demo --codec` runs without it")
    if args.codec:
        from .demo import codec_demo

        codec_demo(sys.stdout, None if args.keep is None else os.fspath(args.keep))
        return EXIT_OK
    from .demo import training_demo

    return EXIT_OK if training_demo(sys.stdout, args.keep) else EXIT_REJECTED


def _max_json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-json-bytes",
        type=byte_size,
        default=DEFAULT_MAX_JSON_BYTES,
        metavar="SIZE",
        help="refuse an exact-bits JSON file larger than this before reading it, where no"
        " destination bounds the read (default: 4G; K, M, G, T are powers of 2)",
    )


def _key_file_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--key-file",
        metavar="FILE",
        help="the key signed sets were saved with: a file of 32 raw bytes, or 64 hex digits"
        " and an optional newline; only sets signed with it verify (without it, signed sets"
        " do not: they cannot be authenticated)",
    )


def _storage_options_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--storage-options",
        metavar="JSON",
        help="for a URL (s3://bucket/run, gs://..., memory://...): the fsspec filesystem's"
        ' options as a JSON object, e.g. \'{"client_kwargs": {"endpoint_url":'
        ' "http://127.0.0.1:9000"}}\'; credentials and the endpoint also come from the'
        " standard environment variables (AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL...)",
    )


def _command(
    sub: argparse._SubParsersAction,
    name: str,
    func: Callable[[argparse.Namespace], int],
    summary: str,
    description: str,
    positionals: Sequence[tuple[str, str]] = (),
) -> argparse.ArgumentParser:
    """A subcommand running ``func``, with its positional arguments (name, help)."""
    p = sub.add_parser(name, help=summary, description=description)
    for argument, text in positionals:
        p.add_argument(argument, help=text)
    p.set_defaults(func=func)
    return p


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``tlckpt`` (exposed for documentation and tests)."""
    parser = argparse.ArgumentParser(
        prog="tlckpt",
        description="Exact, streaming, crash-safe TorchLean checkpoints for PyTorch."
        " Without a command, runs the demo.",
        epilog="Exit status: 0 ok, 1 file rejected (one-line reason), 2 usage error.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = _command(
        sub,
        "inspect",
        _cmd_inspect,
        "describe any checkpoint file",
        "Describe a TLADAMF, TLSF32B or exact-bits JSON file without being told what to expect;"
        " the whole file is checked on the way. Given a checkpoint set's folder, list its"
        " members as its manifest records them.",
        [("file", "the checkpoint, or a checkpoint set's folder")],
    )
    p.add_argument("--json", action="store_true", help="print the description as JSON")
    _max_json_option(p)

    p = _command(
        sub,
        "validate",
        _cmd_validate,
        "exit 0 if a file is well-formed (and fits --against), 1 if not",
        "Check every record, size and the end of the file; with --against, also everything a"
        " load into that destination checks.",
        [("file", "the checkpoint")],
    )
    p.add_argument(
        "--against",
        metavar="REFERENCE",
        help="a reference checkpoint (.tladam: its schema, dtype and config; .tlsf32, .json,"
        " .safetensors, .pt: its shapes) or a JSON destination description (docs/guide.md)",
    )
    _max_json_option(p)

    p = _command(
        sub,
        "convert",
        _cmd_convert,
        "convert model state among TLSF32B, JSON, safetensors and .pt, exactly",
        "Convert model state exactly, or refuse: a value the target cannot hold bit for bit is"
        " an error, never a rounding. .pt files are read with torch.load(weights_only=True)"
        " only.",
        [("src", "source file (.tlsf32, .json, .safetensors, .pt)"), ("dst", "destination file")],
    )
    p.add_argument(
        "--to", choices=sorted(FORMATS), help="destination format (default: by extension)"
    )
    p.add_argument(
        "--dtype",
        metavar="ENCODING",
        help="scalar type of a JSON destination (float64, float32, bfloat16, ...);"
        " default: the source's",
    )
    p.add_argument(
        "--names-from",
        metavar="FILE",
        help="tensor names in order: a text file (one name per line), a .pt state_dict or a"
        " tlckpt-written .safetensors file. Names a positional source going to a named file;"
        " orders a named source (needed to write TLSF32B/JSON from a safetensors file that"
        " other tools wrote)",
    )
    p.add_argument("--compact", action="store_true", help="compact JSON (default: indented)")
    _max_json_option(p)

    p = _command(
        sub,
        "demo",
        _cmd_demo,
        "train, checkpoint, resume and show the resumed run is bit-identical (default)",
        "Train a small model with tied weights, a frozen layer and BatchNorm with AdamW;"
        " checkpoint model and optimizer; resume in fresh objects; compare with the"
        " uninterrupted run bit for bit. Exit 1 if they differ.",
    )
    p.add_argument("--codec", action="store_true", help="the numpy-only codec demo instead")
    p.add_argument("--keep", metavar="DIR", help="write the files to DIR and keep them")

    p = _command(
        sub,
        "ls",
        _cmd_ls,
        "list the checkpoint sets of a directory: steps, sizes, verified or why not",
        "List every checkpoint set folder (step-<20 digits>) of DIR, oldest first, with its"
        " size and whether every member has the size and digest its manifest records (else"
        " the member and the check that failed); count leftovers of interrupted saves.",
        [("dir", "the directory of a CheckpointManager (or its URL)")],
    )
    _key_file_option(p)
    _storage_options_option(p)
    p = _command(
        sub,
        "verify",
        _cmd_verify,
        "exit 0 if a checkpoint set verifies completely, 1 if not",
        "Check one checkpoint set: its manifest, every member's presence, size and xxh3_128"
        " digest, the training-state document, and every member's structure. With"
        " --key-file: the set must be signed with that key (its manifest's MAC, every"
        " member's keyed BLAKE3 digest).",
        [("path", "a checkpoint set folder (or its URL)")],
    )
    _key_file_option(p)
    _storage_options_option(p)

    p = _command(
        sub,
        "export-hf",
        _cmd_export_hf,
        "write a set's model or a model file as a Hugging Face folder",
        "Write model.safetensors, or model-0000i-of-0000N.safetensors shards and"
        " model.safetensors.index.json, as huggingface_hub.save_torch_state_dict names, cuts"
        " and indexes the same state (tied names dropped as it drops them), one tensor at a"
        " time, the index last. Other files of OUT (config.json) are left alone.",
        [
            (
                "src",
                "a checkpoint set's folder, a CheckpointManager directory (its newest set"
                " that verifies), or a .safetensors model file",
            ),
            ("out", "the Hugging Face folder (made if missing)"),
        ],
    )
    p.add_argument(
        "--max-shard-size",
        default="5GB",
        metavar="SIZE",
        help="the most bytes per shard: bytes, or a number with KB, MB, GB, TB (powers of"
        " ten, as huggingface_hub reads them; default 5GB)",
    )
    p.add_argument("--model", metavar="KEY", help="the model of a set of several models")
    _key_file_option(p)

    _command(
        sub,
        "import-hf",
        _cmd_import_hf,
        "write a Hugging Face folder's tensors as one tlckpt model file, exactly",
        "Read model.safetensors, or the shards model.safetensors.index.json names (each"
        " confined to the folder), and write every tensor to OUT: .safetensors (tied tensors"
        " once), .json (exact-bits JSON) or anything else as TLSF32B (float32 only).",
        [("hf_dir", "the Hugging Face folder"), ("out", "the model file to write")],
    )
    return parser


def _cmd_export_hf(args: argparse.Namespace) -> int:
    size: int | str = args.max_shard_size
    if isinstance(size, str) and size.strip().isdigit():
        size = int(size)
    written = export_hf_folder(
        args.src,
        args.out,
        max_shard_size=size,
        model=args.model,
        key=_key(args),
        warn=lambda text: print(f"tlckpt export-hf: warning: {_one_line(text)}", file=sys.stderr),
    )
    print(f"wrote {len(written)} file{'s' if len(written) != 1 else ''} to {args.out}")
    return EXIT_OK


def _cmd_import_hf(args: argparse.Namespace) -> int:
    count = import_hf_folder(args.hf_dir, args.out)
    print(f"wrote {count} tensors to {args.out}")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line and return the exit status (0 ok, 1 rejected, 2 usage).

    Args:
        argv: the arguments (default: ``sys.argv[1:]``); no command runs ``demo``.
    """
    parser = build_parser()
    args_list = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser.parse_args(args_list or ["demo"])
    except SystemExit as exc:  # argparse: usage errors (2) and --help (0)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    if args.command is None:  # options but no command, e.g. ``tlckpt --``
        parser.print_usage(sys.stderr)
        return EXIT_USAGE
    try:
        return args.func(args)
    except _UsageError as exc:
        parser.print_usage(sys.stderr)
        print(f"tlckpt {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except CheckpointError as exc:
        print(f"tlckpt: {type(exc).__name__}: {_one_line(exc)}", file=sys.stderr)
        return EXIT_REJECTED
    except MissingDependencyError as exc:
        print(f"tlckpt {args.command}: {_one_line(exc)}", file=sys.stderr)
        return EXIT_REJECTED
    except BrokenPipeError:
        # The reader of our output went away (``tlckpt inspect f | head``): not an error
        # of any file. Point stdout at devnull so the interpreter's final flush is quiet.
        with contextlib.suppress(OSError, ValueError, AttributeError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except OSError as exc:
        print(f"tlckpt: {type(exc).__name__}: {_one_line(exc)}", file=sys.stderr)
        return EXIT_REJECTED
    except MemoryError:
        print("tlckpt: MemoryError: out of memory", file=sys.stderr)
        return EXIT_REJECTED
    except ImportError as exc:  # an optional dependency the command needs is missing
        print(f"tlckpt: {type(exc).__name__}: {_one_line(exc)}", file=sys.stderr)
        return EXIT_REJECTED
    except KeyboardInterrupt:
        print("tlckpt: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug: still one line, never a traceback
        print(
            f"tlckpt: internal error: {type(exc).__name__}: {_one_line(exc)} (please report it)",
            file=sys.stderr,
        )
        return EXIT_REJECTED

"""Writing exact-bits JSON model state (FORMAT.md §5): checked first, then streamed.

Every caller array is checked before the first byte is written; the document is then streamed
one tensor at a time (values in bounded chunks) through an atomic output, laid out as
:data:`~tlckpt.formats.state_bits.PRETTY` or :data:`~tlckpt.formats.state_bits.COMPACT`
say. Words are serialised by orjson from the arrays' own memory, viewed as unsigned words.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import orjson

from ...formats.state_bits import COMPACT, PRETTY, ScalarFormat
from ..errors import CheckpointError, names_the_file
from ..exact_json.state_words import check_array, format_of, shape_and_words
from ..fileio.atomic import output
from ..fileio.source import PathOrFile

__all__ = ["write_state_bits"]

#: Values serialised per orjson call: bounds the writer's memory to a few MiB of JSON text
#: beyond the caller's arrays, however large one tensor is.
_CHUNK = 1 << 20


def _values_json(words: np.ndarray, native: np.dtype) -> Iterator[bytes]:
    """The JSON array of ``words`` as byte pieces, at most ``_CHUNK`` values at a time."""
    yield b"["
    rows = max(1, _CHUNK // words.shape[-1]) if words.ndim == 2 else _CHUNK
    for start in range(0, len(words), rows):
        if start:
            yield b","
        chunk = np.ascontiguousarray(words[start : start + rows], dtype=native)
        yield orjson.dumps(chunk, option=orjson.OPT_SERIALIZE_NUMPY)[1:-1]
    yield b"]"


def _counted(arrays: Iterator[np.ndarray], count: int) -> Iterator[np.ndarray]:
    """``arrays``, refusing more or fewer than ``count`` of them."""
    n = 0
    for n, array in enumerate(arrays, 1):
        if n > count:
            break
        yield array
    if n != count:
        raise CheckpointError(
            f"{count} arrays announced, {'more' if n > count else n} given", field="arrays"
        )


@names_the_file()
def write_state_bits(
    path: PathOrFile,
    arrays: Sequence[np.ndarray],
    encoding: str | ScalarFormat,
    *,
    pretty: bool = True,
    count: int | None = None,
) -> None:
    """Write arrays as exact-bits JSON model state.

    Every array is checked before the first byte is written; the document is then streamed
    one tensor at a time through an atomic write (a path ends up either the old file or the
    complete new one).

    Args:
        path: destination path, or a binary file object opened by the caller (written as is).
        arrays: one numpy array per state tensor, of the encoding's array dtype: the native
            dtype where numpy has one (float64, float32, float16, complex64, complex128),
            else unsigned storage words (uint16 for bfloat16, uint8 for the float8 formats);
            for a complex format without a native dtype (complex32), words with a trailing
            axis of 2 holding (re, im). Either byte order.
        encoding: a short name (``"float32"``, ``"bfloat16"``, ``"complex32"``, ...) or a
            full format tag (``"torchlean_state_binary_5_2_15_ieee_v1"``).
        pretty: indent the document, one line per tensor; ``False`` writes it compact.
            Either way any standard JSON reader accepts it.
        count: with a count, ``arrays`` may be any iterable of that many arrays (a
            generator): each is checked and written before the next is requested, so the
            caller holds one at a time; a bad array or a wrong number of them then fails
            the write midway, the old file untouched.

    Returns:
        None.

    Raises:
        UnsupportedFormatError: ``encoding`` names no format we can write.
        CheckpointError: ``arrays`` is one array rather than a sequence, or an array has the
            wrong type or dtype, a word-pair array lacks its trailing axis of 2, or a word
            does not fit the format's width; raised before the destination is touched.
        OSError: from the file system; the old file is left as it was.

    Example:
        >>> write_state_bits("state.json", [np.zeros((2, 3), np.float32)], "float32")
    """
    fmt = format_of(encoding)
    if isinstance(arrays, np.ndarray):
        raise CheckpointError(
            "arrays must be a sequence of arrays (one per state tensor), not one array",
            field="arrays",
        )
    checked: Iterable[np.ndarray]
    if count is None:
        try:
            items = list(arrays)
        except TypeError:
            raise CheckpointError(
                f"arrays must be a sequence of arrays, got {type(arrays).__name__}",
                field="arrays",
            ) from None
        checked = [check_array(i, a, fmt) for i, a in enumerate(items)]
    else:
        checked = _counted((check_array(i, a, fmt) for i, a in enumerate(arrays)), count)
    native = np.dtype(fmt.word_dtype).newbyteorder("=")  # what orjson serialises
    layout = PRETTY if pretty else COMPACT
    with output(path) as f:
        f.write(layout.start + orjson.dumps(fmt.tag) + layout.state)
        written = 0
        for i, array in enumerate(checked):
            written += 1
            shape, words = shape_and_words(array, fmt)
            f.write(layout.separator + layout.entry if i else layout.entry)
            f.write(b"[" + layout.dim_separator.join(b"%d" % d for d in shape) + b"]")
            f.write(layout.values)
            for piece in _values_json(words, native):
                f.write(piece)
            f.write(layout.end_entry)
        f.write(layout.end if written else layout.end_empty)

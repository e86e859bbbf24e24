"""Untrusted text as the command line prints it: what a file or a folder says (a manifest's
``library``, a name, an error message quoting them) may hold newlines, terminal escape
sequences or bidirectional overrides; they are shown, never obeyed.
"""

from __future__ import annotations

__all__ = ["printable"]


def printable(text: object) -> str:
    """``str(text)`` with every character that is not printable written as its Python
    escape: control characters (``\\n``, the ``\\x1b`` that starts an ANSI escape sequence),
    format characters (``\\u202e``), lone surrogates. Printable text is returned as it is.

    Args:
        text: anything; its ``str`` is shown.

    Returns:
        One line of printable characters.
    """
    s = str(text)
    if s.isprintable():
        return s
    # repr of one character is its escape between quotes ('\n' -> \n, '\x1b' -> \x1b).
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in s)

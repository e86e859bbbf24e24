"""The command line (``python -m tlckpt`` / ``tlckpt``): inspect, validate, convert, demo."""

from .main import build_parser, main

__all__ = ["build_parser", "main"]

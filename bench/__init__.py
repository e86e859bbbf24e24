"""Benchmark suite: tlckpt against torch.save, safetensors and the raw-I/O limit.

Run it from the repository root with ``.venv/bin/python -m bench`` (see ``bench/README.md``).
Benchmarks are scripts that write reports; nothing here is imported by the library or its
tests, and no timing is ever asserted.
"""

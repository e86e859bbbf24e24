"""The engine: a ``formats`` spec compiled into a streaming, validating reader and writer.

Holds the planner (:mod:`.plan`: a spec's fields, fixed sizes, fast paths), the walker that
reads a file against a spec with a visitor (:mod:`.walker`, records in batches:
:mod:`.batches`, :mod:`.header_scan`), the builder that writes one (:mod:`.builder`), the byte
layout of a file from its metadata (:mod:`.layout`), the framing every family starts with
(:mod:`.framed`) and the checks of TorchLean's schema blocks (:mod:`.schema_check`).

May import: ``formats``, :mod:`..errors`, :mod:`..paths`, :mod:`..fileio`, :mod:`..values`.
"""

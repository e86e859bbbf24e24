"""The exact-bits JSON codec: documents read within bounds, words parsed exactly.

Holds :mod:`.json_document` (a document's bytes read within bounds, duplicate keys refused),
:mod:`.json_words` (the fast path over word arrays), :mod:`.state_words` (words to values and
back, bit-exact) and :mod:`.json_diagnosis` (why a document is refused, with its place).

May import: ``formats``, :mod:`..errors`, :mod:`..sniffing`, :mod:`..families`, :mod:`..fileio`.
"""

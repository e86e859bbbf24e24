"""Model-state families: ``TLSF32B`` (float32 binary) and exact-bits JSON.

Holds each family's reader and writer (:mod:`.float32_state`, :mod:`.float32_state_writer`,
:mod:`.state_bits`, :mod:`.state_bits_writer`), the header template a destination gives
(:mod:`.state_template`) and their registrations (:mod:`.model_state_families`).

May import: ``formats``, the codec's faces (:mod:`..errors`, :mod:`..paths`,
:mod:`..families`, :mod:`..inspection`), :mod:`..spec`, :mod:`..fileio`, :mod:`..values`,
:mod:`..exact_json`.
"""

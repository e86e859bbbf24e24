"""The operations, each written once over a placement: save and load per family.

Holds :mod:`.float32_files` and :mod:`.float32_bulk` (``TLSF32B``), :mod:`.bits_files`
(exact-bits JSON), :mod:`.optimizer_files` (``TLADAMF`` and ``TLCKOPT``) and
:mod:`.state_tensors` (a module's named tensors, tie checks, what a load writes).

May import: ``tlckpt.codec``, :mod:`..binding`, :mod:`..placement`, :mod:`..commit`, torch.
"""

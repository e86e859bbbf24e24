"""The operations, each written once over a placement: save and load per family.

Holds :mod:`.float32_files` and :mod:`.float32_bulk` (``TLSF32B``), :mod:`.bits_files`
(exact-bits JSON), :mod:`.optimizer_files` (``TLADAMF`` and ``TLCKOPT``; any other optimizer
through :mod:`.optimizer_trees` and :mod:`.optimizer_tree_checks`), the safetensors
operations (:mod:`.tensor_files`: named tensors; :mod:`.named_module_state`: a module's
state, staged by :mod:`.entry_staging`; :mod:`.state_trees`: nested state;
:mod:`.lazy_files`: ``open_checkpoint``) and :mod:`.state_tensors` (a module's named tensors,
tie checks, each payload's arrival).

May import: ``tlckpt.codec``, :mod:`..binding`, :mod:`..placement`, :mod:`..commit`, torch.
"""

"""Optimizer families: TorchLean's ``TLADAMF``, tlckpt's own ``TLCKOPT``, and optimizer trees.

Holds each family's reader, writer and registration (:mod:`.adam`, :mod:`.adam_writer`,
:mod:`.adam_family`; :mod:`.tlckpt_optimizer`, :mod:`.tlckpt_optimizer_writer`,
:mod:`.tlckpt_optimizer_family`), what they share (:mod:`.optimizer_reader`: the reader base;
:mod:`.writer_checks`; :mod:`.adam_types`) and which TorchLean version a state fits
(:mod:`.torchlean_fit`); optimizer trees, any ``torch.optim`` optimizer's state in the
safetensors layout (:mod:`.optimizer_tree`: the document; :mod:`.optimizer_tree_family`).

May import: ``formats``, the codec's faces (:mod:`..errors`, :mod:`..paths`,
:mod:`..families`, :mod:`..inspection`), :mod:`..spec`, :mod:`..fileio`, :mod:`..values`;
for optimizer trees :mod:`..safetensors` (the layout) and :mod:`..sets` (exact values).
"""

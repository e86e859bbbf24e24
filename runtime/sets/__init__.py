"""Checkpoint sets of a whole training state: writing, restoring, retention.

Holds :mod:`.set_writing`, :mod:`.set_restoring` and their entry points
(:mod:`.checkpoint_sets`), :mod:`.checkpoint_manager` (steps, retention, async saves),
:mod:`.snapshot` (live state copied for an async save), :mod:`.sharded_background` (async
saves of sharded models, on a process group of their own), :mod:`.training_state`,
:mod:`.param_group_values` and :mod:`.rng_states` (the training state's documents bound to
torch objects), and sets of several models, optimizers and schedulers
(:mod:`.multi_set_writing`, :mod:`.multi_set_restoring`; their structure and member
families, :mod:`.set_structure`), sets of one state tree (:mod:`.state_tree_sets`), and remote
sets restored and retained (:mod:`.remote_sets`).

May import: ``tlckpt.codec``, :mod:`..binding`, :mod:`..placement`, :mod:`..commit` and
:mod:`..ops` (a set is saved and restored through the same operations), torch; not the
public faces. Nothing imports it but the runtime's ``__init__`` and the framework plug-ins
(``tlckpt.integrations``, through :mod:`.state_tree_sets` and :mod:`.training_state`).
"""

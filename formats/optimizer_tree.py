"""Optimizer state trees: any ``torch.optim`` optimizer's state, keyed by parameter names, in
the safetensors layout (:mod:`.safetensors`) — tlckpt's own family, not TorchLean's.

``save_optimizer`` writes this family for every optimizer that is not Adam/AdamW (those keep
``TLADAMF``/``TLCKOPT``). A file is an ordinary safetensors file, so any safetensors reader
opens its tensors; its ``__metadata__`` has exactly one entry, :data:`DOCUMENT_KEY`, whose
value is a JSON object (the checkpoint set's exact tagged JSON, ``formats.checkpoint_set``
``VALUE_TAGS``: non-finite floats, big ints, tuples kept exactly)::

    {"format": "tlckpt.optimizer_tree", "version": 1,
     "class": "torch.optim.sgd.SGD", "random_counter": null,
     "tensors": [name, ...],
     "groups": [{"params": [[param name, dtype word, [dims]], ...],
                 "options": {hyperparameter: value, ...}}, ...],
     "state": {param name: {state key: value, ...}, ...}}

* ``class``: the optimizer's ``module.qualname``; a load into another class is refused.
* ``random_counter``: the training run's random counter (a non-negative integer), or null.
* ``groups``: each param group in order, its parameters by name in the group's order, each
  with its safetensors dtype word and shape; ``options`` is every other group key (the
  execution flags :data:`EXECUTION_FLAGS` too, which a load leaves as the live run has them).
* ``state``: per parameter name (in param-group order), its state dict. Each value is a JSON
  value, or a tensor — the tagged scalar ``{"$tensor": ["file_tensor", i]}`` standing for
  ``tensors[i]`` — or a list/tuple/dict of those (LBFGS's ``old_dirs``, ``al``).
* ``tensors``: the file's tensor names, each exactly once, in the order the placeholders
  number them. A tensor of the state is named :data:`STATE_PREFIX` ``<param name>/<key>``
  (then ``/<index>`` or ``/<key>`` for each container level below); a tensor-valued group
  option (a tensor ``lr``) :data:`GROUP_PREFIX` ``<group index>/<key>``. ``step`` and other
  scalar tensors are rank-0 tensors of their own dtype.

The writer puts the document first (it is the only metadata entry, and the safetensors writer
emits ``__metadata__`` first), so a file's head starts with :data:`HEAD`: that is how the
family is told from its first bytes. A file rewritten by another tool (its header reordered)
is still read by ``load_optimizer``, which looks for the entry in the header whatever its place.
"""

from __future__ import annotations

from .safetensors import METADATA_KEY

__all__ = [
    "DOCUMENT_KEY",
    "FORMAT_TAG",
    "VERSION",
    "DOCUMENT_KEYS",
    "FORMAT_MEMBER",
    "VERSION_MEMBER",
    "CLASS_MEMBER",
    "COUNTER_MEMBER",
    "TENSORS_MEMBER",
    "GROUPS_MEMBER",
    "STATE_MEMBER",
    "PARAMS_MEMBER",
    "OPTIONS_MEMBER",
    "GROUP_KEYS",
    "STATE_PREFIX",
    "GROUP_PREFIX",
    "SEPARATOR",
    "TENSOR_PLACEHOLDER",
    "EXECUTION_FLAGS",
    "NAMES_KEY",
    "HEAD",
    "FAMILY",
]

#: The family's name in the family registry (``inspect(path)["family"]``).
FAMILY = "optimizer_tree"
#: The one ``__metadata__`` entry of a file: the document.
DOCUMENT_KEY = "tlckpt.optimizer_tree"
#: The document's ``format`` member.
FORMAT_TAG = "tlckpt.optimizer_tree"
#: The document's layout version that this module describes.
VERSION = 1
#: The document's members.
FORMAT_MEMBER = "format"
VERSION_MEMBER = "version"
CLASS_MEMBER = "class"
COUNTER_MEMBER = "random_counter"
TENSORS_MEMBER = "tensors"
GROUPS_MEMBER = "groups"
STATE_MEMBER = "state"
#: The document's members, exactly these, in the order the writer emits them.
DOCUMENT_KEYS = (
    FORMAT_MEMBER,
    VERSION_MEMBER,
    CLASS_MEMBER,
    COUNTER_MEMBER,
    TENSORS_MEMBER,
    GROUPS_MEMBER,
    STATE_MEMBER,
)
#: A group's members: its parameters (``[name, dtype word, shape]`` each) and its options.
PARAMS_MEMBER = "params"
OPTIONS_MEMBER = "options"
GROUP_KEYS = (PARAMS_MEMBER, OPTIONS_MEMBER)
#: Tensor names: state tensors, and tensor-valued group options.
STATE_PREFIX = "state/"
GROUP_PREFIX = "groups/"
#: Between the parts of a tensor's name.
SEPARATOR = "/"
#: The tagged-scalar dtype word of a placeholder for ``tensors[i]``.
TENSOR_PLACEHOLDER = "file_tensor"
#: Group keys that say how the live run computes, not what its state means: stored, but a
#: load keeps the live optimizer's.
EXECUTION_FLAGS = ("foreach", "fused", "capturable", "differentiable")
#: The group key torch keeps parameter names under when an optimizer is built from
#: ``named_parameters()``: the live run's, like the parameters themselves.
NAMES_KEY = "param_names"
#: How every file the writer makes begins after its 8-byte header length.
HEAD = ('{"' + METADATA_KEY + '":{"' + DOCUMENT_KEY + '":').encode()

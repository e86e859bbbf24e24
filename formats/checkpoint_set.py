"""Checkpoint sets: one folder per training step, its members, its manifest and its
training-state document (no I/O, no torch).

A set is a folder named ``step-<20 digits>`` (fixed width, so that lexical order is numeric
order) holding:

* the model state — ``model.tlsf32`` (``TLSF32B``, float32 models) or ``model.json``
  (exact-bits JSON, any other dtype): TorchLean files, readable by TorchLean;
* the optimizer file ``optimizer.tladam`` (TorchLean's ``TLADAMF`` or tlckpt's own family),
  when the set has an optimizer;
* the training-state document ``training_state.json`` (:data:`TRAINING_STATE_KEYS`);
* the manifest ``manifest.json``, written last: the commit point (:data:`MANIFEST_KEYS`).

Every document is JSON, each key once. Values that JSON cannot hold exactly (a non-finite
float, an integer beyond 64 bits, a tuple, a mapping whose keys are not all plain strings,
the ``collections`` containers of schedulers' states, a set) are written as one-member
objects whose key is a tag (:data:`VALUE_TAGS`); a mapping with a plain string key that
starts with :data:`TAG_MARK` is itself written tagged, so a tag is never mistaken for data.
Every bound a reader enforces is in :data:`LIMITS`, which the writers check too.

Manifest::

    {"format": "tlckpt_checkpoint_set", "version": 1, "step": 1200,
     "library": "tlckpt 0.1.0", "digest": "xxh3_128",
     "members": {"model": {"file": "model.tlsf32", "family": "float32_state",
                           "version": 1, "size": 1234, "digest": "<32 hex digits>"}, ...},
     "state": [["embed.weight", [32, 16]], ...], "world_size": 1,
     "self_digest": "<32 hex digits>"}

``self_digest`` is the manifest's own ``xxh3_128``: of the compact JSON (orjson's) of the
document without that key, keys in the document's order. The manifest is what the members
are checked against, so a flipped byte in it (a tensor name, a version, the library) must be
caught too.

A *signed* set (saved with a key) has the same members and a manifest authenticated with it
(:data:`SIGNED_MANIFEST_KEYS`)::

    {"format": "tlckpt_checkpoint_set", "version": 1, "step": 1200,
     "library": "tlckpt 0.1.0", "digest": "blake3_keyed", "key_id": "<16 hex digits>",
     "members": {"model": {..., "digest": "<64 hex digits>"}, ...},
     "state": [...], "world_size": 1,
     "mac": "<64 hex digits>"}

The member digests are BLAKE3 keyed with a member key derived from the caller's 32-byte key;
``mac`` is BLAKE3 keyed with a manifest key over the manifest's exact bytes before
:data:`MAC_SUFFIX_PREFIX` (everything but the MAC); ``key_id`` names the key without revealing
it. The normative description — derivations, the order of the reader's checks, what the MAC
binds and what it cannot show — is ``docs/format.md`` §7; the constants are here.

Training state::

    {"format": "tlckpt_training_state", "version": 1, "step": 1200,
     "random_counter": 57 | null, "scheduler": <value> | null,
     "param_groups": [{"lr": 0.001, "betas": {"$tuple": [0.9, 0.999]}, ...}] | null,
     "rng": {"torch": "<hex>", "cuda": ["<hex>", ...], "numpy": {...},
             "random": {...}} | null,
     "extra": <value> | null}
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "SET_FORMAT",
    "SET_VERSION",
    "TRAINING_STATE_FORMAT",
    "TRAINING_STATE_VERSION",
    "STEP_PREFIX",
    "STEP_DIGITS",
    "STEP_MAX",
    "FOLDER_PATTERN",
    "folder_name",
    "MANIFEST_FILE",
    "TRAINING_STATE_FILE",
    "MODEL_FLOAT32_FILE",
    "MODEL_BITS_FILE",
    "OPTIMIZER_FILE",
    "MODEL_BITS_VERSION",
    "TRAINING_STATE_FAMILY",
    "MEMBER_ROLES",
    "MEMBER_FILES",
    "REQUIRED_MEMBERS",
    "DIGEST_ALGORITHM",
    "DIGEST_HEX_DIGITS",
    "KEYED_DIGEST_ALGORITHM",
    "KEYED_DIGEST_HEX_DIGITS",
    "KEY_BYTES",
    "KEY_ID_HEX_DIGITS",
    "MEMBER_KEY_CONTEXT",
    "MANIFEST_KEY_CONTEXT",
    "KEY_ID_CONTEXT",
    "MAC_FIELD",
    "MAC_SUFFIX_PREFIX",
    "MANIFEST_KEYS",
    "SIGNED_MANIFEST_KEYS",
    "MEMBER_KEYS",
    "TRAINING_STATE_KEYS",
    "RNG_KEYS",
    "SetLimits",
    "LIMITS",
    "MAX_MANIFEST_BYTES",
    "MAX_TRAINING_STATE_BYTES",
    "MAX_VALUE_DEPTH",
    "MAX_NAME_BYTES",
    "MAX_RANK",
    "MAX_INT_DIGITS",
    "TAG_MARK",
    "TAG_FLOAT",
    "TAG_INT",
    "TAG_TUPLE",
    "TAG_DICT",
    "TAG_TENSOR",
    "TAG_COUNTER",
    "TAG_ORDERED_DICT",
    "TAG_DEFAULT_DICT",
    "TAG_DEQUE",
    "TAG_SET",
    "TAG_FROZENSET",
    "VALUE_TAGS",
    "DEFAULT_FACTORIES",
    "INT_RANGE",
    "SET_VERSION_2",
    "SET_VERSIONS",
    "STRUCTURE_ROLES",
    "STRUCTURE_KINDS",
    "STRUCTURE_KEY_PATTERN",
    "MAX_STRUCTURE_KEYS",
    "MODEL_SAFETENSORS_SUFFIX",
    "SAFETENSORS_MEMBER_VERSION",
    "MEMBER_SUFFIXES_V2",
    "MANIFEST_KEYS_V2",
    "SIGNED_MANIFEST_KEYS_V2",
    "MODEL_MEMBER_KEYS_V2",
    "OPTIMIZER_MEMBER_KEYS_V2",
    "STRUCTURE_ENTRY_KEYS",
    "SET_VERSION_3",
    "STATE_TREE_MEMBER",
    "STATE_TREE_FILE",
    "MANIFEST_KEYS_V3",
    "SIGNED_MANIFEST_KEYS_V3",
    "STATE_TREE_MEMBER_KEYS",
]

# --------------------------------------------------------------------------- documents

#: The manifest's ``format`` tag and version.
SET_FORMAT = "tlckpt_checkpoint_set"
#: v1: the first version.
SET_VERSION = 1
#: The training-state document's ``format`` tag and version.
TRAINING_STATE_FORMAT = "tlckpt_training_state"
#: v1: the first version.
TRAINING_STATE_VERSION = 1

# --------------------------------------------------------------------------- folder names

#: A set's folder: ``step-`` and the step in 20 decimal digits (every u64 fits), so that
#: lexical order is numeric order.
STEP_PREFIX = "step-"
STEP_DIGITS = 20
STEP_MAX = 2**64 - 1
FOLDER_PATTERN = re.compile(rf"{re.escape(STEP_PREFIX)}([0-9]{{{STEP_DIGITS}}})")


def folder_name(step: int) -> str:
    """The folder name of ``step`` (``step-00000000000000001200``)."""
    return f"{STEP_PREFIX}{step:0{STEP_DIGITS}d}"


# --------------------------------------------------------------------------- members

MANIFEST_FILE = "manifest.json"
TRAINING_STATE_FILE = "training_state.json"
MODEL_FLOAT32_FILE = "model.tlsf32"
MODEL_BITS_FILE = "model.json"
OPTIMIZER_FILE = "optimizer.tladam"
#: The version a manifest records for an exact-bits JSON model member (its tags end in
#: ``_v1``) and the family it records for the training-state member.
MODEL_BITS_VERSION = 1
TRAINING_STATE_FAMILY = "training_state"

#: The members a manifest lists, by role, in the order they are written.
MEMBER_ROLES = ("model", "optimizer", "training_state")
#: The file names each role may have.
MEMBER_FILES = {
    "model": (MODEL_FLOAT32_FILE, MODEL_BITS_FILE),
    "optimizer": (OPTIMIZER_FILE,),
    "training_state": (TRAINING_STATE_FILE,),
}
#: The roles every set has (the optimizer is optional).
REQUIRED_MEMBERS = ("model", "training_state")

#: The digest of every member: XXH3's 128-bit variant over the file's bytes in order,
#: written as 32 lowercase hex digits. Not cryptographic: it catches damage, not forgery.
DIGEST_ALGORITHM = "xxh3_128"
DIGEST_HEX_DIGITS = 32

#: The digest of every member of a signed set: BLAKE3 in keyed mode (with the member key
#: derived from the caller's key), 256 bits, written as 64 lowercase hex digits. A forged
#: member cannot be given the digest of the original without the key.
KEYED_DIGEST_ALGORITHM = "blake3_keyed"
KEYED_DIGEST_HEX_DIGITS = 64
#: The caller's key: 32 bytes (a key file holds them raw, or as 64 hex digits and an
#: optional newline).
KEY_BYTES = 32
#: The key id a signed manifest records: 8 bytes derived from the key, in hex.
KEY_ID_HEX_DIGITS = 16
#: BLAKE3 key-derivation contexts (globally unique, fixed forever for this version): one
#: key per use, so that a member's digest can never serve as a manifest's MAC.
MEMBER_KEY_CONTEXT = "tlckpt 2026-12 checkpoint set member digest v1"
MANIFEST_KEY_CONTEXT = "tlckpt 2026-12 checkpoint set manifest mac v1"
KEY_ID_CONTEXT = "tlckpt 2026-12 checkpoint set key id v1"
#: The signed manifest's last member, its MAC; the MAC covers the manifest's exact bytes
#: before ``MAC_SUFFIX_PREFIX`` (the manifest ends with it, the MAC's hex digits and ``"}``).
MAC_FIELD = "mac"
MAC_SUFFIX_PREFIX = b',"mac":"'

#: The manifest's members: each must be present, once.
MANIFEST_KEYS = (
    "format",
    "version",
    "step",
    "library",
    "digest",
    "members",
    "state",
    "world_size",
    "self_digest",
)
#: A signed set's manifest: ``key_id`` added, ``mac`` (last) in place of ``self_digest``.
SIGNED_MANIFEST_KEYS = (
    "format",
    "version",
    "step",
    "library",
    "digest",
    "key_id",
    "members",
    "state",
    "world_size",
    "mac",
)
#: A member's entry in the manifest.
MEMBER_KEYS = ("file", "family", "version", "size", "digest")
#: The training-state document's members.
TRAINING_STATE_KEYS = (
    "format",
    "version",
    "step",
    "random_counter",
    "scheduler",
    "param_groups",
    "rng",
    "extra",
)
#: The global random states a training-state document holds (``rng``): torch's CPU generator
#: (its state bytes in hex), each CUDA device's (a list, possibly empty), numpy's legacy
#: global generator and Python's ``random``.
RNG_KEYS = ("torch", "cuda", "numpy", "random")

# --------------------------------------------------------------------------- bounds


@dataclass(frozen=True)
class SetLimits:
    """The bounds of a set's documents: every reader refuses what passes one, and every
    writer checks the same bounds before anything is written or committed, so that what a
    save accepts a restore reads back (one table for both sides: :data:`LIMITS`).

    Attributes:
        manifest_bytes: the largest manifest (a model of a million named tensors fits).
        training_state_bytes: the largest training-state document (scheduler,
            hyperparameters, random states and the caller's ``extra``).
        value_depth: the deepest nesting of containers in a value (a scheduler's state,
            ``extra``): ``[]`` is nested 1 deep, ``[[1]]`` 2. Every container counts once,
            however its JSON is tagged (a ``$dict`` is one level, like a plain object).
        name_bytes: the longest tensor name in a manifest, in UTF-8 bytes.
        rank: the most dimensions of a tensor shape in a manifest.
        int_digits: the most decimal digits of a tagged integer (Python's own default
            limit for ``int(str)``).
        library_bytes: the longest ``library`` a manifest names, in UTF-8 bytes.
        family_bytes: the longest member family name.
        world_size: the most processes a set may record.
    """

    manifest_bytes: int = 256 << 20
    training_state_bytes: int = 256 << 20
    value_depth: int = 64
    name_bytes: int = 4096
    rank: int = 64
    int_digits: int = 4300
    library_bytes: int = 256
    family_bytes: int = 64
    world_size: int = 1 << 24


#: The one table of bounds (:class:`SetLimits`), read at call time by the writers and the
#: readers of both documents.
LIMITS = SetLimits()

# The same bounds by their historical names (for readers that pass a bound explicitly).
MAX_MANIFEST_BYTES = LIMITS.manifest_bytes
MAX_TRAINING_STATE_BYTES = LIMITS.training_state_bytes
MAX_VALUE_DEPTH = LIMITS.value_depth
MAX_NAME_BYTES = LIMITS.name_bytes
MAX_RANK = LIMITS.rank
MAX_INT_DIGITS = LIMITS.int_digits

# --------------------------------------------------------------------------- exact values

#: Tagged values are one-member objects whose key starts with this character.
TAG_MARK = "$"
#: A binary64 that JSON has no number for (infinities, NaN with its payload): its 64 bits as
#: ``"0x"`` and 16 hex digits.
TAG_FLOAT = "$float"
#: An integer outside :data:`INT_RANGE`: its decimal digits.
TAG_INT = "$int"
#: A tuple: the array of its items.
TAG_TUPLE = "$tuple"
#: A mapping whose keys are not all plain strings (or one of which starts with
#: :data:`TAG_MARK`): the array of its ``[key, value]`` pairs.
TAG_DICT = "$dict"
#: A zero-dimensional tensor (a learning rate held as a tensor): ``[dtype name, value]``.
TAG_TENSOR = "$tensor"
#: A ``collections.Counter`` (``MultiStepLR``'s milestones): the array of its ``[key, count]``
#: pairs, in its order.
TAG_COUNTER = "$counter"
#: A ``collections.OrderedDict``: the array of its ``[key, value]`` pairs, in order.
TAG_ORDERED_DICT = "$ordereddict"
#: A ``collections.defaultdict`` whose default factory is one of :data:`DEFAULT_FACTORIES`:
#: the factory's name (``null`` for none), then its ``[key, value]`` pairs.
TAG_DEFAULT_DICT = "$defaultdict"
#: A ``collections.deque``: its ``maxlen`` (``null`` for none), then its items.
TAG_DEQUE = "$deque"
#: A ``set``: the array of its items (in the set's iteration order at the save).
TAG_SET = "$set"
#: A ``frozenset``: the array of its items.
TAG_FROZENSET = "$frozenset"
VALUE_TAGS = (
    TAG_FLOAT,
    TAG_INT,
    TAG_TUPLE,
    TAG_DICT,
    TAG_TENSOR,
    TAG_COUNTER,
    TAG_ORDERED_DICT,
    TAG_DEFAULT_DICT,
    TAG_DEQUE,
    TAG_SET,
    TAG_FROZENSET,
)
#: The default factories a tagged ``defaultdict`` may name: types whose call makes a value
#: the document holds exactly. Any other factory (a lambda, a function) is code: refused.
DEFAULT_FACTORIES = (
    "bool",
    "int",
    "float",
    "str",
    "list",
    "tuple",
    "dict",
    "set",
    "frozenset",
    "collections.Counter",
    "collections.OrderedDict",
    "collections.deque",
)
#: Integers written as JSON numbers: what every JSON reader of 64-bit integers keeps exactly.
INT_RANGE = (-(2**63), 2**64 - 1)

# --------------------------------------------------------------------------- version 2
#
# Version 2 of the manifest describes sets that version 1 cannot: several models,
# optimizers or schedulers (a GAN; Muon beside AdamW), and members in the safetensors layout
# (a bf16 model; an optimizer other than Adam/AdamW). A writer writes version 1 whenever the
# set fits it — one model in a TorchLean family, at most one Adam/AdamW optimizer and one
# scheduler, each passed as one object — so that such sets stay byte-identical to what
# earlier versions wrote and earlier readers keep reading them. Version 2::
#
#     {"format": "tlckpt_checkpoint_set", "version": 2, "step": 1200,
#      "library": "tlckpt 0.1.0", "digest": "xxh3_128",
#      "members": {
#        "model.G": {"file": "model.G.safetensors", "family": "safetensors", "version": 0,
#                    "size": 1234, "digest": "<hex>",
#                    "tensors": [["fc.weight", [4, 4]], ...],
#                    "tied": {"head.weight": "emb.weight"}},
#        "optimizer.G": {"file": "optimizer.G.tladam", ..., "models": ["model.G"], "groups": 1},
#        "training_state": {...}},
#      "structure": {"model": {"kind": "mapping", "keys": ["G", "D"]},
#                    "optimizer": {"kind": "mapping", "keys": ["G", "D"]},
#                    "scheduler": null},
#      "world_size": 1, "self_digest": "<hex>"}
#
# A role's structure is ``null`` (none given), ``{"kind": "single", "keys": []}`` (one
# object: its member is the role itself, ``model``), ``"sequence"`` (keys ``"0"``, ``"1"``,
# ...: members ``model.0``, ...) or ``"mapping"`` (the caller's keys, in its order). A model
# member records its state tensors ``[name, shape]`` in ``state_dict`` order (tied names
# included) and, in ``tied``, each name that is the same tensor as an earlier one, mapped to
# that one. An optimizer member records the model members it binds to (the models holding its
# parameters; with two or more its parameter names are qualified ``<model key>.<name>``) and
# its number of param groups: the training state's ``param_groups`` are every optimizer's,
# in structure order. With a sequence or mapping of schedulers, the training state's
# ``scheduler`` maps each scheduler's key to its ``state_dict``. A signed version-2 manifest
# adds ``key_id`` after ``digest`` and ends with ``mac`` in place of ``self_digest``, as in
# version 1; the MAC covers every field above.

#: The manifest version of sets version 1 cannot describe.
SET_VERSION_2 = 2
#: The roles whose objects a set's structure records.
STRUCTURE_ROLES = ("model", "optimizer", "scheduler")
#: How a role's objects were given.
STRUCTURE_KINDS = ("single", "sequence", "mapping")
#: A mapping's key (it names member files: ``model.<key>.safetensors``).
STRUCTURE_KEY_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_\-]{0,63}")
#: The most objects one role may hold.
MAX_STRUCTURE_KEYS = 1024
#: A version-2 model member in the safetensors layout.
MODEL_SAFETENSORS_SUFFIX = ".safetensors"
#: The version a manifest records of a member in the safetensors layout, which has none.
SAFETENSORS_MEMBER_VERSION = 0
#: The file suffixes of version-2 members, by role; a member's file is its role (``model``,
#: ``model.G``) followed by one of these.
MEMBER_SUFFIXES_V2 = {
    "model": (".tlsf32", ".json", MODEL_SAFETENSORS_SUFFIX),
    "optimizer": (".tladam", ".safetensors"),
    "training_state": (".json",),
}
#: Version 2's manifest keys (unsigned and signed): version 1's, in the same order, with
#: ``structure`` in place of ``state``.
MANIFEST_KEYS_V2 = tuple("structure" if k == "state" else k for k in MANIFEST_KEYS)
SIGNED_MANIFEST_KEYS_V2 = tuple("structure" if k == "state" else k for k in SIGNED_MANIFEST_KEYS)
#: Version 2's member entries, by role.
MODEL_MEMBER_KEYS_V2 = (*MEMBER_KEYS, "tensors", "tied")
OPTIMIZER_MEMBER_KEYS_V2 = (*MEMBER_KEYS, "models", "groups")
#: A structure entry's keys.
STRUCTURE_ENTRY_KEYS = ("kind", "keys")

# --------------------------------------------------------------------------- version 3
#
# Version 3 is a set of one *state tree*: a framework's whole checkpoint as it hands it over
# (Lightning's checkpoint dict: model ``state_dict``, optimizer states, schedulers, loops,
# callbacks, hyperparameters), with no module or optimizer to bind it to. Its tensors are in
# one safetensors member, ``state.safetensors``, the tree itself (structure and every
# non-tensor value, exactly) in that file's ``__metadata__`` (``tlckpt.state``, see
# ``tlckpt.runtime.ops.state_trees``); the training-state document holds the step, the
# global random states and, in ``extra``, what the writer needs to rebuild the tree::
#
#     {"format": "tlckpt_checkpoint_set", "version": 3, "step": 5,
#      "library": "tlckpt 0.1.0", "digest": "xxh3_128",
#      "members": {
#        "state": {"file": "state.safetensors", "family": "safetensors", "version": 0,
#                  "size": 1234, "digest": "<hex>",
#                  "tensors": [["state_dict.net.0.weight", [8, 4]], ...], "tied": {}},
#        "training_state": {...}},
#      "world_size": 1, "self_digest": "<hex>"}
#
# ``tensors`` lists the member's tensors (names as in its header, in file order; a tensor
# the tree holds in several places is stored once, so ``tied`` is always empty). A signed
# version-3 manifest adds ``key_id`` and ends with ``mac``, as versions 1 and 2.

#: The manifest version of a set of one state tree.
SET_VERSION_3 = 3
#: Its tree member's role and file.
STATE_TREE_MEMBER = "state"
STATE_TREE_FILE = "state.safetensors"
#: Version 3's manifest keys (unsigned and signed): version 1's without ``state`` (the
#: tree member lists its tensors).
MANIFEST_KEYS_V3 = tuple(k for k in MANIFEST_KEYS if k != "state")
SIGNED_MANIFEST_KEYS_V3 = tuple(k for k in SIGNED_MANIFEST_KEYS if k != "state")
#: The tree member's entry.
STATE_TREE_MEMBER_KEYS = (*MEMBER_KEYS, "tensors", "tied")

#: Every manifest version this library reads.
SET_VERSIONS = (SET_VERSION, SET_VERSION_2, SET_VERSION_3)

"""Test support shipped with the library: strategies, vectors, a model, exact comparisons.

* :mod:`tlckpt.testing.strategies` — hypothesis strategies for well-formed schemas, configs,
  counters, bit-exact float payloads and whole checkpoint states (needs ``hypothesis``);
* :mod:`tlckpt.testing.value_strategies` — hypothesis strategies for a training-state
  document's values (schedulers' states, ``extra``), exact or just past the readers' bounds;
* :mod:`tlckpt.testing.vectors` — where the conformance vectors are (``tests/vectors``), and
  their manifest entries as the codec's values (``ParameterSchema``, ``AdamConfig``, arrays);
* :mod:`tlckpt.testing.adam` — the AdamW configuration tests write when its values do not matter;
* :mod:`tlckpt.testing.limits` — child processes under resource limits, sparse files;
* :mod:`tlckpt.testing.processes` — a free port and a gloo rank's environment for process
  groups on this machine, resident-set figures (peak since a reset);
* :mod:`tlckpt.testing.models` — a small model with tied, frozen and buffer state, its
  deterministic training, Adam/AdamW in every implementation (needs ``torch``);
* :mod:`tlckpt.testing.bitwise` — bit-for-bit comparisons and snapshots of tensors, modules
  and optimizers (needs ``torch``);
* :mod:`tlckpt.testing.recipes` — the models and param groups of real training recipes
  (``transformers``' GPT-2 and BERT of any size, the Trainer's and timm's groups), for the
  resume tests and the optimizer benchmark (needs ``torch`` and ``transformers``).

None of them is imported here, so ``import tlckpt.testing`` needs neither a test dependency
nor torch.
"""

__all__: list[str] = []

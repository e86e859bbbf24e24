"""Test support shipped with the library: hypothesis strategies and conformance-vector helpers.

* :mod:`tlckpt.testing.strategies` — hypothesis strategies for well-formed schemas, configs,
  counters, bit-exact float payloads and whole checkpoint states (needs ``hypothesis``);
* :mod:`tlckpt.testing.vectors` — where the conformance vectors are (``tests/vectors``), and
  their manifest entries as the codec's values (``ParameterSchema``, ``AdamConfig``, arrays).

Neither module is imported here, so ``import tlckpt.testing`` needs no test dependency.
"""

__all__: list[str] = []

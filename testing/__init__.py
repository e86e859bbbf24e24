"""Test support shipped with the library: hypothesis strategies and conformance-vector helpers.

* :mod:`tlckpt.testing.strategies` — hypothesis strategies for well-formed schemas, configs,
  counters, bit-exact float payloads and whole checkpoint states (needs ``hypothesis``);
* :mod:`tlckpt.testing.vectors` — turning ``shared/vectors/manifest.json`` entries into the
  codec's values (``ParameterSchema``, ``AdamConfig``, moment arrays).

Neither module is imported here, so ``import tlckpt.testing`` needs no test dependency.
"""

__all__: list[str] = []

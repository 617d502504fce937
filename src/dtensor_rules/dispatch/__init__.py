"""What DTensor calls on a sharding-cache miss for our ops: the strategy choice.

:mod:`~dtensor_rules.dispatch.greedy` picks dispatch's strategy from single-dim rows without the
``rows ** mesh.ndim`` product; :mod:`~dtensor_rules.dispatch.single_dim` serves every single-dim
rule that way (the registry installs rules through it); :mod:`~dtensor_rules.dispatch.rows` does
the same for ``op_strategy`` rules given as rows (``cat``, ``slice_scatter``);
:mod:`~dtensor_rules.dispatch.runnable` keeps only strategies dispatch can run;
:mod:`~dtensor_rules.dispatch.cache_miss` is the cache-miss callback patch (``x[mask]``, ``out=``
errors, finishers); :mod:`~dtensor_rules.dispatch.custom_handler` is the per-op handler for ops
whose output shape depends on data (``bincount``). Solvers and the validator still get the full
enumeration. See docs/dispatch.md.
"""

from dtensor_rules.dispatch import exact_int_partition as _exact_int_partition  # noqa: F401  (registers its patch)

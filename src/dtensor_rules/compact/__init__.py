"""Compact strategy sets for DTensor dispatch; the full enumeration for solvers and the validator.

:mod:`~dtensor_rules.compact.greedy` picks dispatch's strategy from single-dim rows without the
``rows ** mesh.ndim`` product; :mod:`~dtensor_rules.compact.single_dim` serves every single-dim
rule that way (the registry installs rules through it); :mod:`~dtensor_rules.compact.rows` does
the same for ``op_strategy`` rules given as rows (``cat``, ``slice_scatter``). See
docs/compact_dispatch.md.
"""

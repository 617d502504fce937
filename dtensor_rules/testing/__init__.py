"""Test helpers shipped with the package so users can check their own rules.

- :func:`simulated_mesh`: a real DeviceMesh with every rank simulated in-process.
- :func:`run_gloo`: run a function on real multi-process gloo ranks.
- :func:`local_shards`: every rank's local shard of a DTensor (simulated) or this rank's (real PG).
- :func:`check_rule`: compare a rule (ours and upstream's) with ground truth.
- :mod:`dtensor_rules.testing.strategies`: hypothesis strategies for meshes, placements, shapes.
"""

from dtensor_rules.testing.mesh import fake_world, run_gloo, simulated_mesh
from dtensor_rules.testing.shards import local_shards
from dtensor_rules.testing.validator import RuleReport, SideReport, check_rule, check_samples

__all__ = ["simulated_mesh", "fake_world", "run_gloo", "local_shards", "check_rule", "check_samples", "RuleReport", "SideReport"]

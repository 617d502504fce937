"""Ordered-mesh redistribute planner: layouts with a device order, an alpha-beta cost model,
exact A* search over compact states, and an executor on torch.distributed collectives.

See ``docs/redistribute.md``.
"""

from dtensor_rules.redistribute import order_patches as _order_patches  # noqa: F401  (registers the shard_order fixes)
from dtensor_rules.redistribute.api import distribute_tensor, layout_of, local_shard_offsets, plan, redistribute
from dtensor_rules.redistribute.layout import Layout, normalize_orders, parse_layout
from dtensor_rules.redistribute import cache  # noqa: F401  (plan caches; see cache.py)
from dtensor_rules.redistribute.cache import clear_plan_cache
from dtensor_rules.redistribute.planner import NoPlanError, Plan, Step
from dtensor_rules.redistribute.topology import Topology

__all__ = [
    "plan", "redistribute", "distribute_tensor", "layout_of", "local_shard_offsets",
    "Layout", "parse_layout", "normalize_orders", "Plan", "Step", "NoPlanError", "Topology", "clear_plan_cache",
]

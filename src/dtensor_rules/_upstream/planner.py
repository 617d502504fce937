"""Upstream's redistribute planner (``torch.distributed.tensor._redistribute``), for side-by-side benchmarks.

``benchmarks/planner_vs_upstream.py`` times it against ours and prices its paths; nothing in the
package plans with it. :func:`cached_planner` hands out upstream's own cached function object, not
a wrapper, so timing its cached lookup adds no call of ours to upstream's side.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from torch.distributed.tensor import _redistribute as R

from dtensor_rules._upstream.types import DTensorSpec, ShardOrderEntry

__all__ = ["cached_planner", "clear_planner_caches", "min_cost_planning", "plan_uncached", "walk_path"]

TransformInfo = Any  # upstream's _TransformInfo: one single-mesh-dim step


def min_cost_planning() -> AbstractContextManager[None]:
    """Upstream's graph-based min-cost planner on, inside the ``with`` block."""
    return R.use_min_cost_redistribution_plan(True)


def clear_planner_caches() -> None:
    """Forget upstream's planner objects and its cached transform infos."""
    R.clear_redistribute_planner_cache()
    R._gen_transform_infos.cache_clear()


def plan_uncached(src: DTensorSpec, dst: DTensorSpec) -> list[TransformInfo]:
    """Upstream's steps from ``src`` to ``dst``, planned afresh (its cache bypassed)."""
    return R._gen_transform_infos_non_cached(src, dst)


def cached_planner() -> Callable[[DTensorSpec, DTensorSpec], list[TransformInfo]]:
    """Upstream's cached planning function itself (``functools.cache`` on the two specs)."""
    return R._gen_transform_infos


def walk_path(placements: Sequence[Any], shard_order: tuple[ShardOrderEntry, ...],
              infos: Sequence[TransformInfo]) -> list[tuple[tuple[Any, ...], dict[int, tuple[int, ...]]]]:
    """(placements, {tensor dim: mesh dims, major first}) after each of upstream's steps, start included."""
    planner = R.DTensorRedistributePlanner
    current = list(placements)
    order = planner._ShardOrder_to_dict(shard_order)

    def snapshot() -> tuple[tuple[Any, ...], dict[int, tuple[int, ...]]]:
        entries = planner._dict_to_ShardOrder(order)
        return tuple(current), {e.tensor_dim: tuple(e.mesh_dims) for e in entries}

    out = [snapshot()]
    for info in infos:
        R._update_shard_order_and_placements(info, current, order)
        out.append(snapshot())
    return out

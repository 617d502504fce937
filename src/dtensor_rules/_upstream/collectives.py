"""Single-mesh-dim placement transitions, as DTensor's own placement methods do them.

They pad and unpad uneven shards for one mesh dim given the per-rank logical shape, and work
under LocalTensorMode; :mod:`dtensor_rules.redistribute.executor` lowers every planned step to
one of these instead of re-writing collectives.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor._collective_utils import one_step_redistribute_cost
from torch.distributed.tensor._collective_utils import redistribute_cost  # full spec -> spec estimate (op strategies)
from torch.distributed.tensor.placement_types import Partial, Shard

__all__ = [
    "ALL_TO_ALL_SINGLE",
    "SHARD_TO_PARTIAL_SUM_RUNS",
    "funcol",
    "one_step_redistribute_cost",
    "partial_partition",
    "swap_partial_partition",
    "flatten_mesh",
    "partial_reduce",
    "partial_reduce_scatter",
    "redistribute_cost",
    "shard_all_gather",
    "shard_all_to_all",
    "shard_from_replicate",
]

# DTensor's redistribute runs Shard -> Partial("sum") (materialising the full-size local tensor)
# from torch 2.14; 2.13 raises "not supported yet". No release runs Shard -> another Partial, or
# one Partial kind -> another, and ``redistribute_cost`` prices all of them infinite.
SHARD_TO_PARTIAL_SUM_RUNS: bool = hasattr(Shard, "_to_partial_tensor")

# the op funcol's ``all_to_all_single`` dispatches: what ``CommDebugMode`` counts an all-to-all as
ALL_TO_ALL_SINGLE = torch.ops._c10d_functional.all_to_all_single.default


def shard_all_gather(local: torch.Tensor, mesh: DeviceMesh, mesh_dim: int, dim: int, logical: Sequence[int]) -> Any:
    """Shard(dim) -> Replicate on ``mesh_dim``."""
    return Shard(dim)._to_replicate_tensor(local, mesh, mesh_dim, list(logical))


def shard_all_to_all(
    local: torch.Tensor, mesh: DeviceMesh, mesh_dim: int, src: int, dst: int, logical: Sequence[int]
) -> Any:
    """Shard(src) -> Shard(dst) on ``mesh_dim``."""
    return Shard(src)._to_new_shard_dim(local, mesh, mesh_dim, list(logical), dst)


def shard_from_replicate(local: torch.Tensor, mesh: DeviceMesh, mesh_dim: int, dim: int, coordinate: Any) -> Any:
    """Replicate -> Shard(dim) on ``mesh_dim`` (a local chunk, no communication)."""
    return Shard(dim)._replicate_to_shard(local, mesh, mesh_dim, coordinate)


def partial_reduce(partial: Partial, local: torch.Tensor, mesh: DeviceMesh, mesh_dim: int) -> Any:
    """Partial -> Replicate (all_reduce)."""
    return partial._reduce_value(local, mesh, mesh_dim)


def partial_reduce_scatter(partial: Partial, local: torch.Tensor, mesh: DeviceMesh, mesh_dim: int, dim: int) -> Any:
    """Partial -> Shard(dim) (reduce_scatter)."""
    return partial._reduce_shard_value(local, mesh, mesh_dim, Shard(dim))


def partial_partition(partial: Partial, local: torch.Tensor, mesh: DeviceMesh, mesh_dim: int) -> Any:
    """Replicate -> Partial (sum: v/n on every rank; max/min: the value everywhere)."""
    return partial._partition_value(local, mesh, mesh_dim)


def swap_partial_partition(fn: Any) -> Any:
    """Install ``fn`` as ``Partial``'s Replicate -> Partial method; returns the one it replaces."""
    old = Partial.__dict__["_partition_value"]
    Partial._partition_value = fn
    return old


def flatten_mesh(mesh: DeviceMesh, dims: Sequence[str]) -> DeviceMesh:
    """The 1-D mesh over ``dims`` of ``mesh`` (in mesh order), ranks numbered row-major: torchtitan's
    borrowed ep group. ``DeviceMesh._flatten`` is private; this is its one caller."""
    return mesh[tuple(dims)]._flatten("_".join(dims))

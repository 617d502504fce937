"""``local_shards``: what every rank holds, without reaching into private attributes."""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor

from dtensor_rules._upstream import rank_tensors

__all__ = ["local_shards"]


def local_shards(dt: DTensor | torch.Tensor) -> list[torch.Tensor]:
    """Per-rank local shards, in rank order.

    On a simulated mesh (``simulated_mesh``: every rank in this process) one tensor per rank;
    on a real process group the one shard this process holds. A plain (non-DTensor) tensor
    that is simulated per rank (e.g. ``full_tensor()`` under ``simulated_mesh``) gives its
    per-rank copies; any other plain tensor, itself.
    """
    local = dt.to_local() if isinstance(dt, DTensor) else dt
    per_rank = rank_tensors(local)
    return [per_rank[r] for r in sorted(per_rank)] if per_rank is not None else [local]

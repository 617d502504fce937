"""``route``: a router's ``(T, k)`` expert ids -> the flat routed ids, ragged in token order, with their sizes.

This is where the routing matrix is born: rank ``s``'s ``bincount`` of its own ids is its row of
``C`` (no communication), so the returned ``(T*k,)`` ids carry a :class:`RaggedContext` with ``C``
and ``RaggedShard(0, E, aligned=False)``: rank ``s`` holds exactly the rows of the unaligned layout,
but in its TOKEN order (``row_offset`` set: its first global token-major row, ``k`` times its
first token). Only a stable ``sort`` / ``argsort`` puts them in the layout's order (its rule,
``ragged/sorting.py``); the moves refuse them until then, since ``full_tensor()`` would read them
in the wrong order. Row-preserving ops (lift) and ``bincount`` / ``histc`` accept them as they are.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor, Shard

from dtensor_rules._upstream import maybe_run_for_local_tensor
from dtensor_rules.ragged.context import attach, counts_from_local, make_context
from dtensor_rules.ragged.placement import RaggedShard
from dtensor_rules.ragged.rulekit import chunk_offset

__all__ = ["route"]


@maybe_run_for_local_tensor
def _counts(flat: torch.Tensor, num_experts: int) -> torch.Tensor:
    if flat.numel() and (bool((flat < 0).any()) or bool((flat >= num_experts).any())):
        raise ValueError(f"expert ids must lie in [0, num_experts={num_experts})")
    return torch.bincount(flat, minlength=num_experts)


def route(ids: DTensor, num_experts: int, mesh_dim: int = 0) -> DTensor:
    """``(T, k)`` integer ids ``Shard(0)`` on ``mesh_dim`` (Replicate elsewhere) -> ``(T*k,)`` routed ids."""
    if not isinstance(ids, DTensor) or ids.placements[mesh_dim] != Shard(0) or type(ids.placements[mesh_dim]) is not Shard \
            or any(not p.is_replicate() for i, p in enumerate(ids.placements) if i != mesh_dim):
        got = ids.placements if isinstance(ids, DTensor) else type(ids).__name__
        raise ValueError(f"route needs the ids as a DTensor Shard(0) on the EP mesh dim {mesh_dim} and Replicate on the "
                         f"others (tokens split over EP ranks), got {got}")
    if ids.dim() != 2 or ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise ValueError(f"ids must be the (T, k) integer expert ids, got {tuple(ids.shape)} {ids.dtype}")
    mesh, (T, k) = ids.device_mesh, ids.shape
    flat = ids.to_local().reshape(-1)
    counts = counts_from_local(_counts(flat, num_experts), mesh, mesh_dim)
    placements = list(ids.placements)
    placements[mesh_dim] = RaggedShard(0, num_experts, aligned=False)
    out = DTensor.from_local(flat, mesh, placements, run_check=False, shape=(T * k,), stride=(1,))
    ctx = make_context(counts, mesh_dim, mesh)._replace(row_offset=chunk_offset(mesh, mesh_dim, T) * k)
    return attach(out, ctx)

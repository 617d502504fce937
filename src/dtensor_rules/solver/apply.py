"""Run the block with the solver's parameter placements, so a choice is checked by running it.

Only the parameters (and the input) are placed as chosen; DTensor's dispatch then lays out
every intermediate itself. A choice that dispatch cannot run, or that computes something else
than one device, fails here rather than in a table.
"""

from __future__ import annotations

import functools

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

from dtensor_rules.models.moe import MoE, distribute_params
from dtensor_rules.solver.query import Layout

__all__ = ["apply_choice", "expert_parallel_dim"]


def apply_choice(module: MoE, mesh: DeviceMesh, params: dict[str, Layout], x: torch.Tensor,
                 input_layout: Layout, ragged: bool = False) -> DTensor:
    """Distribute ``module``'s parameters as ``params`` (in place) and run it on ``x`` laid out as
    ``input_layout``; returns the output DTensor (its ``full_tensor()`` is what one device computes).

    ``ragged``: run the routed experts on the ragged path (``shard_moe(ragged=True)``'s region:
    permute, dispatch, grouped matmuls on aligned rows, combine), as an expert-parallel choice
    (experts ``Shard(0)`` on one mesh dim, the ep dim) means, with the tokens ``Shard(0)`` on that
    dim and replicated on the others (what the permute takes); without it DTensor's plain rules
    run the block."""
    from dtensor_rules._upstream import per_rank_copies

    if ragged:
        ep_dim = expert_parallel_dim(params)
        if ep_dim is None:
            raise ValueError(f"ragged=True runs experts Shard(0) on one mesh dim (ep), the same for w1, w3 and w2; "
                             f"the choice has {[params[w] for w in ('w1', 'w3', 'w2')]}")
        from dtensor_rules.models.ragged_moe import ragged_routed_experts

        module.routed_region = functools.partial(ragged_routed_experts, ep_dim=ep_dim)
        input_layout = tuple(Shard(0) if i == ep_dim else Replicate() for i in range(mesh.ndim))
    distribute_params(module, mesh, dict(params), (Replicate(),) * mesh.ndim)
    return module(distribute_tensor(per_rank_copies(x), mesh, input_layout))


def expert_parallel_dim(params: dict[str, Layout]) -> int | None:
    """The mesh dim on which every routed expert weight is ``Shard(0)`` (split by expert), if any."""
    dims = [{i for i, p in enumerate(params[w]) if type(p) is Shard and p.dim == 0} for w in ("w1", "w3", "w2")]
    common = set.intersection(*dims)
    return min(common) if len(common) == 1 else None

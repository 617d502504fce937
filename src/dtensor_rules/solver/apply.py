"""Run the block with the solver's parameter placements, so a choice is checked by running it.

Only the parameters (and the input) are placed as chosen; DTensor's dispatch then lays out
every intermediate itself. A choice that dispatch cannot run, or that computes something else
than one device, fails here rather than in a table.
"""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

from dtensor_rules.models.moe import MoE, distribute_params
from dtensor_rules.solver.query import Layout

__all__ = ["apply_choice"]


def apply_choice(module: MoE, mesh: DeviceMesh, params: dict[str, Layout], x: torch.Tensor,
                 input_layout: Layout, ragged: bool = False) -> DTensor:
    """Distribute ``module``'s parameters as ``params`` (in place) and run it on ``x`` laid out as
    ``input_layout``; returns the output DTensor (its ``full_tensor()`` is what one device computes).

    ``ragged``: run the routed experts on the ragged path (``shard_moe(ragged=True)``'s region:
    permute, dispatch, grouped matmuls on aligned rows, combine), as an expert-parallel choice
    (experts ``Shard(0)`` on mesh dim 0) means, with the tokens ``Shard(0)`` on ep and replicated
    on the other mesh dims (what the permute takes); without it DTensor's plain rules run the block."""
    from dtensor_rules._upstream import per_rank_copies

    if ragged:
        if any(getattr(params[w][0], "dim", None) != 0 or not params[w][0].is_shard() for w in ("w1", "w3", "w2")):
            raise ValueError(f"ragged=True runs experts Shard(0) on mesh dim 0 (ep); the choice has "
                             f"{[params[w] for w in ('w1', 'w3', 'w2')]}")
        from dtensor_rules.models.ragged_moe import ragged_routed_experts

        module.routed_region = ragged_routed_experts
        # the permute takes tokens split over ep only (Replicate on the other mesh dims)
        input_layout = (Shard(0),) + (Replicate(),) * (mesh.ndim - 1)
    distribute_params(module, mesh, dict(params), (Replicate(),) * mesh.ndim)
    return module(distribute_tensor(per_rank_copies(x), mesh, input_layout))

"""Run the block with the solver's parameter placements, so a choice is checked by running it.

Only the parameters (and the input) are placed as chosen; DTensor's dispatch then lays out
every intermediate itself. A choice that dispatch cannot run, or that computes something else
than one device, fails here rather than in a table.
"""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, distribute_tensor

from dtensor_rules.models.moe import MoE, distribute_params
from dtensor_rules.solver.query import Layout

__all__ = ["apply_choice"]


def apply_choice(module: MoE, mesh: DeviceMesh, params: dict[str, Layout], x: torch.Tensor,
                 input_layout: Layout) -> DTensor:
    """Distribute ``module``'s parameters as ``params`` (in place) and run it on ``x`` laid out as
    ``input_layout``; returns the output DTensor (its ``full_tensor()`` is what one device computes)."""
    from dtensor_rules._upstream import per_rank_copies

    distribute_params(module, mesh, dict(params), (Replicate(),) * mesh.ndim)
    return module(distribute_tensor(per_rank_copies(x), mesh, input_layout))

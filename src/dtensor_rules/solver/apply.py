"""Run the block with the solver's parameter placements, so a choice is checked by running it.

Only the parameters (and the input) are placed as chosen; DTensor's dispatch then lays out
every intermediate itself. A choice that dispatch cannot run, or that computes something else
than one device, fails here rather than in a table.

An expert-parallel choice (``ep=True``: the routed experts ``Shard(0)`` on one mesh dim) runs
through :func:`~dtensor_rules.ep.expert_parallel.expert_parallel`, the package's one EP
runtime (tokens to the experts' owners by all-to-all, each rank multiplying by its own experts):

==============================================  ==========================================
the choice, per mesh dim of the expert weights   what ``expert_parallel`` is given
==============================================  ==========================================
w1, w3, w2 all ``Shard(0)``                       ``ep_dim`` (exactly one such dim)
w1, w3 ``Shard(2)`` and w2 ``Shard(1)`` (hidden)  ``tp_dim`` (the first such dim): expert TP
anything else (``Replicate``, another split)      stored as chosen, gathered in the region
                                                  (expert FSDP); tokens replicated there
==============================================  ==========================================

Every parameter (router, shared expert, experts) is stored exactly as chosen
(``expert_parallel(..., placements=params)``); the router and shared expert run under DTensor's
rules as placed.
"""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

from dtensor_rules.models.moe import MoE, distribute_params
from dtensor_rules.solver.query import Layout

__all__ = ["apply_choice", "place_choice", "expert_parallel_dim", "expert_tp_dim"]

_EXPERTS = ("w1", "w3", "w2")


def apply_choice(module: MoE, mesh: DeviceMesh, params: dict[str, Layout], x: torch.Tensor,
                 input_layout: Layout, *, ep: bool = False) -> DTensor:
    """Place ``module``'s parameters as ``params`` (in place, :func:`place_choice`) and run it on ``x``
    laid out as ``input_layout``; returns the output DTensor (its ``full_tensor()`` is what one
    device computes).

    ``ep``: run the routed experts expert-parallel through ``expert_parallel`` on the ep dim the
    choice holds (module docstring); raises ``ValueError`` if w1, w3 and w2 are not ``Shard(0)``
    on exactly one common mesh dim. Without it DTensor's plain rules run the whole block (a
    ``Shard(0)`` of the experts is then all-gathered)."""
    from dtensor_rules._upstream import per_rank_copies

    place_choice(module, mesh, params, ep=ep)
    return module(distribute_tensor(per_rank_copies(x), mesh, tuple(input_layout)))


def place_choice(module: MoE, mesh: DeviceMesh, params: dict[str, Layout], *, ep: bool = False) -> MoE:
    """:func:`apply_choice` without the run: ``module`` with its parameters placed as ``params`` (in
    place), and with ``ep`` its routed experts installed as ``expert_parallel``'s region; call it
    (or ``torch.compile`` it) on tokens laid out as the choice's ``input_layout``."""
    if not ep:
        return distribute_params(module, mesh, dict(params), (Replicate(),) * mesh.ndim)
    ep_dim = expert_parallel_dim(params)
    if ep_dim is None:
        raise ValueError(f"ep=True runs the experts Shard(0) on one mesh dim (ep), the same for w1, w3 and w2; "
                         f"the choice has {[tuple(params[w]) for w in _EXPERTS]}")
    from dtensor_rules.ep.expert_parallel import expert_parallel

    return expert_parallel(module, mesh, ep_dim=ep_dim, tp_dim=expert_tp_dim(params, ep_dim),
                           placements={k: tuple(v) for k, v in params.items()})


def expert_parallel_dim(params: dict[str, Layout]) -> int | None:
    """The mesh dim on which every routed expert weight is ``Shard(0)`` (split by expert), if exactly one."""
    dims = [{i for i, p in enumerate(params[w]) if type(p) is Shard and p.dim == 0} for w in _EXPERTS]
    common = set.intersection(*dims)
    return min(common) if len(common) == 1 else None


def expert_tp_dim(params: dict[str, Layout], ep_dim: int) -> int | None:
    """The first mesh dim other than ``ep_dim`` that splits every expert on hidden (w1, w3 ``Shard(2)``,
    w2 ``Shard(1)``: the ``MoE`` block's (E, D, H) / (E, H, D) weights), if any: expert TP."""
    want = {"w1": Shard(2), "w3": Shard(2), "w2": Shard(1)}
    n = len(params["w1"])
    return next((i for i in range(n) if i != ep_dim and all(params[w][i] == want[w] for w in _EXPERTS)), None)

"""An MoE block's expert parallelism written with placements only (issue 19 item 4, stepping stone).

Tokens ``Shard(0)`` on the EP mesh dim, router ``Replicate``, experts ``Shard(0)`` (and TP splits
on another mesh dim, as :func:`~dtensor_rules.models.moe.shard_moe` lays them out). The block is
ordinary DTensor code; the EP moves are redistributes between ``RaggedShard`` layouts:

1. route (upstream rules, local on ``Shard(0)`` tokens);
2. :func:`dtensor_rules.ragged.permute`: the ``(T*k, D)`` assignment rows, unaligned ragged
   (each rank sorts its own; its counts are its row of the routing matrix);
3. ``rows.redistribute(mesh, [RaggedShard(0, E, aligned=True)])``: the dispatch (counts
   all-to-all, token all-to-all);
4. the global group ends ``offs``: the routing matrix's column sums (``sum(0)`` is ``Partial``,
   ``Replicate`` is one all-reduce of ``E`` ints), ``cumsum``: what one device passes;
5. SwiGLU with ``_grouped_mm`` on the aligned rows and the ``Shard(0)`` experts (the ragged rules:
   local, each rank its own experts; expert gradients stay ``Shard(0)``);
6. ``redistribute`` back to unaligned: the combine; :func:`dtensor_rules.ragged.unpermute`: the
   weighted sum into ``Shard(0)`` tokens (local).

No expert and no token is all-gathered. Steps 2 and 6 are package moves standing in for the
``argsort`` / ``index`` / ``scatter_add`` rules of the design (not written yet). The groups are
not padded to the ``_grouped_mm`` alignment (the CPU kernel does not need it).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor, Replicate

from dtensor_rules import ragged
from dtensor_rules.ragged import RaggedShard

__all__ = ["ragged_moe", "ragged_routed_experts", "routed_by_placements"]


def _swiglu(w1: DTensor, w3: DTensor, w2: DTensor) -> Callable[[DTensor, DTensor], DTensor]:
    def experts(rows: DTensor, offs: DTensor) -> DTensor:
        h = F.silu(torch._grouped_mm(rows, w1, offs)) * torch._grouped_mm(rows, w3, offs)
        return torch._grouped_mm(h, w2, offs)
    return experts


def routed_by_placements(x: DTensor, ids: DTensor, weights: DTensor, num_experts: int,
                         experts: Callable[[DTensor, DTensor], DTensor], ep_dim: int = 0) -> DTensor:
    """Steps 2-6 of the module docstring: ``(T, D)`` tokens -> ``(T, D)`` routed-expert output."""
    mesh, E = x.device_mesh, num_experts
    rows, perm = ragged.permute(x, ids, E, ep_dim)
    to = list(rows.placements)
    to[ep_dim] = RaggedShard(0, E, aligned=True)
    rows = rows.redistribute(mesh, to)  # the dispatch
    counts = ragged.context_of(rows).counts  # (ep, E) Shard(0) on ep: each rank's routed counts
    offs = counts.sum(0).redistribute(mesh, [Replicate()] * mesh.ndim).cumsum(0).to(torch.int32)
    y = experts(rows, offs)
    back = list(y.placements)
    back[ep_dim] = RaggedShard(0, E, aligned=False)
    y = y.redistribute(mesh, back)  # the combine
    return ragged.unpermute(y, perm, weights.to(y.dtype))


def ragged_moe(x: DTensor, router: DTensor, w1: DTensor, w3: DTensor, w2: DTensor, top_k: int) -> DTensor:
    """One MoE block (softmax top-k router, SwiGLU experts) on a 1-D ep mesh."""
    if x.device_mesh.ndim != 1:
        raise ValueError(f"ragged_moe runs on a 1-D ep mesh, got a {x.device_mesh.ndim}-D mesh")
    weights, ids = torch.topk(F.softmax(x @ router, dim=-1), top_k, dim=-1)
    return routed_by_placements(x, ids, weights, w1.shape[0], _swiglu(w1, w3, w2))


def ragged_routed_experts(module: torch.nn.Module, x2: DTensor, idx: DTensor, weights: DTensor,
                          ep_dim: int = 0) -> DTensor:
    """``MoE.routed_region`` for ``shard_moe(..., ragged=True)``: the module's experts on the ragged path
    (experts ``Shard(0)`` and tokens ``Shard(0)`` on mesh dim ``ep_dim``)."""
    return routed_by_placements(x2, idx, weights, module.config.n_experts,
                                lambda rows, offs: module.experts(rows, offs).to(x2.dtype), ep_dim)

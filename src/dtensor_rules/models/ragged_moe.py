"""An MoE block's expert parallelism written with placements only (issue 19 item 4, stepping stone).

On a 1-D "ep" mesh: tokens ``Shard(0)``, router ``Replicate``, experts ``Shard(0)``. The block is
ordinary DTensor code; the EP moves are redistributes between ``RaggedShard`` layouts:

1. route (``x @ router``, ``softmax``, ``topk``: upstream rules, local on ``Shard(0)`` tokens);
2. :func:`dtensor_rules.ragged.permute`: the ``(T*k, D)`` assignment rows, unaligned ragged
   (each rank sorts its own; its counts are its row of the routing matrix);
3. ``x.redistribute(mesh, [RaggedShard(0, E, aligned=True)])``: the dispatch (counts all-to-all,
   token all-to-all);
4. the global group ends ``offs``: the routing matrix's column sums (``sum(0)`` is ``Partial``,
   ``Replicate`` is one all-reduce of ``E`` ints), ``cumsum``: what one device passes;
5. SwiGLU with ``_grouped_mm`` on the aligned rows and the ``Shard(0)`` experts (the ragged rules:
   local, each rank its own experts; expert gradients stay ``Shard(0)``);
6. ``redistribute`` back to unaligned: the combine; :func:`dtensor_rules.ragged.unpermute`: the
   weighted sum into ``Shard(0)`` tokens (local).

No expert and no token is all-gathered. Steps 2 and 6 are package moves standing in for the
``argsort`` / ``index`` / ``scatter_add`` rules of the design (not written yet).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor, Replicate

from dtensor_rules import ragged
from dtensor_rules.ragged import RaggedShard

__all__ = ["ragged_moe"]


def ragged_moe(x: DTensor, router: DTensor, w1: DTensor, w3: DTensor, w2: DTensor, top_k: int) -> DTensor:
    """One MoE block forward (``x`` ``(T, D)`` Shard(0) on a 1-D ep mesh, experts ``(E, D, H)`` / ``(E, H, D)`` Shard(0))."""
    mesh, E = x.device_mesh, w1.shape[0]
    if mesh.ndim != 1:
        raise ValueError(f"ragged_moe runs on a 1-D ep mesh, got a {mesh.ndim}-D mesh")
    weights, ids = torch.topk(F.softmax(x @ router, dim=-1), top_k, dim=-1)
    rows, perm = ragged.permute(x, ids, E)
    rows = rows.redistribute(mesh, [RaggedShard(0, E, aligned=True)])  # the dispatch
    counts = ragged.context_of(rows).counts  # (ep, E) Shard(0): each rank's routed counts
    offs = counts.sum(0).redistribute(mesh, [Replicate()]).cumsum(0).to(torch.int32)
    h = F.silu(torch._grouped_mm(rows, w1, offs)) * torch._grouped_mm(rows, w3, offs)
    y = torch._grouped_mm(h, w2, offs)
    y = y.redistribute(mesh, [RaggedShard(0, E, aligned=False)])  # the combine
    return ragged.unpermute(y, perm, weights.to(y.dtype))

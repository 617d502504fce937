"""Tokens -> unaligned ragged assignment rows and back: the two ends of an EP block.

:func:`permute` turns ``Shard(0)`` tokens and their ``(T, k)`` expert ids into the ``(T*k, D)``
assignment rows laid out ``RaggedShard(0, E, aligned=False)``, with the routing matrix as their
context. It is exact as a global statement: a *stable* sort of the token-major flat ids over all
ranks orders the assignments partition-major and sender-minor (rank 0's tokens come first within
each expert), which is the ragged dim's global order; restricted to one rank that sort is the
rank's local stable sort. So no rows move: each rank sorts its own, and counts its own
(``bincount``: its row of the routing matrix, no communication).

:func:`unpermute` is the way back after the combine: every assignment row of token ``t`` lives
on ``t``'s rank in the unaligned layout, so the weighted sum into ``Shard(0)`` tokens is local.

These two stand in for the per-op rules of the design (``argsort`` / ``index`` / ``scatter_add``
on ragged coordinates, docs/design/ragged_expert_placement.md §5.3), which are not written yet:
both run local ops between ``to_local`` and ``from_local`` like the moves do, and autograd runs
through them (``index_select`` <-> ``index_add``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor, Shard

from dtensor_rules.ragged.moves import grad_placements
from dtensor_rules.ragged.context import attach, counts_from_local, make_context
from dtensor_rules.ragged.placement import RaggedShard

__all__ = ["Permutation", "permute", "unpermute"]


class Permutation(NamedTuple):
    """What :func:`unpermute` needs: the local sort order and the token layout."""

    order: Tensor  # local: flat assignment index (token * k + slot) of each local ragged row
    top_k: int
    tokens: DTensor  # the Shard(0) tokens permute was given (their mesh, placements, shape)


def _check_tokens(x: DTensor, ids: DTensor, mesh_dim: int) -> None:
    for name, t in (("x", x), ("ids", ids)):
        if not isinstance(t, DTensor) or t.placements[mesh_dim] != Shard(0) or any(
                not p.is_replicate() for i, p in enumerate(t.placements) if i != mesh_dim):
            got = t.placements if isinstance(t, DTensor) else type(t).__name__
            raise ValueError(f"permute needs {name} as a DTensor Shard(0) on the EP mesh dim {mesh_dim} and Replicate "
                             f"on the others (tokens split over EP ranks), got {got}")
    if ids.dim() != 2 or ids.shape[0] != x.shape[0] or ids.dtype.is_floating_point:
        raise ValueError(f"ids must be the (T, k) integer expert ids of x's T={x.shape[0]} tokens, got "
                         f"{tuple(ids.shape)} {ids.dtype}")


def permute(x: DTensor, ids: DTensor, num_experts: int, mesh_dim: int = 0) -> tuple[DTensor, Permutation]:
    """``Shard(0)`` tokens ``(T, D)`` and expert ids ``(T, k)`` -> ``(T*k, D)`` rows ``RaggedShard(0, E, False)``."""
    _check_tokens(x, ids, mesh_dim)
    mesh, k = x.device_mesh, ids.shape[1]
    flat = ids.to_local().reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = counts_from_local(torch.bincount(flat, minlength=num_experts), mesh, mesh_dim)
    rows = x.to_local(grad_placements=grad_placements(x.placements, mesh_dim)).index_select(0, order // k)
    placements = list(x.placements)
    placements[mesh_dim] = RaggedShard(0, num_experts, aligned=False)
    shape = (x.shape[0] * k, *x.shape[1:])
    out = DTensor.from_local(rows, mesh, placements, run_check=False, shape=shape,
                             stride=torch.empty(shape, device="meta").stride(),
                             grad_placements=grad_placements(placements, mesh_dim))
    return attach(out, make_context(counts, mesh_dim, mesh)), Permutation(order, k, x)


def _row_placements(weights: DTensor, mesh_dim: int, ragged: RaggedShard) -> list:
    placements = list(weights.placements)
    placements[mesh_dim] = ragged
    return placements


def unpermute(y: DTensor, perm: Permutation, weights: DTensor) -> DTensor:
    """Unaligned rows ``(T*k, D)`` -> ``Shard(0)`` tokens ``out[t] = sum_j weights[t, j] * y[row of (t, j)]``."""
    tokens = perm.tokens
    mesh_dim = next(i for i, p in enumerate(tokens.placements) if p == Shard(0))
    p = y.placements[mesh_dim]
    if not (isinstance(p, RaggedShard) and not p.aligned and p.dim == 0):
        raise ValueError(f"unpermute needs the rows unaligned (combine them first), got {y.placements}")
    if not isinstance(weights, DTensor) or tuple(weights.placements) != tuple(tokens.placements) or tuple(weights.shape) != (tokens.shape[0], perm.top_k):
        raise ValueError(f"weights must be the (T, k) routing weights laid out like the tokens ({tokens.placements})")
    # the weights go to the rows as a DTensor and multiply there, not on local tensors: ``y`` may be
    # Partial on another mesh dim (tp after a row-parallel w2), and the weights' gradient is then
    # Partial too, which only DTensor's mul rule knows
    w_rows = DTensor.from_local(weights.to_local().reshape(-1).index_select(0, perm.order).to(y.dtype),
                                y.device_mesh, _row_placements(weights, mesh_dim, p), run_check=False,
                                shape=(y.shape[0],), stride=(1,))
    yl = (y * w_rows.unsqueeze(-1)).to_local()
    local_tokens = tokens.to_local().shape[0]
    out = yl.new_zeros((local_tokens, *yl.shape[1:])).index_add(0, perm.order // perm.top_k, yl)
    shape = (tokens.shape[0], *y.shape[1:])
    placements = list(y.placements)  # other mesh dims as the rows (Partial over tp after a row-parallel w2)
    placements[mesh_dim] = Shard(0)
    return DTensor.from_local(out, tokens.device_mesh, placements, run_check=False, shape=shape,
                              stride=torch.empty(shape, device="meta").stride())

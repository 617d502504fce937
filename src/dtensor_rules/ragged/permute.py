"""Tokens -> unaligned ragged assignment rows and back: the two ends of an EP block, as DTensor op calls.

:func:`permute` is what one device writes, run on DTensors through the ragged rules:

1. :func:`~dtensor_rules.ragged.route.route`: the ``(T*k,)`` flat ids, ragged in token order, with
   the routing matrix (each rank's ``bincount`` of its own ids: its row, no communication);
2. ``torch.argsort(flat, stable=True)`` (``ragged/sorting.py``): a stable sort of the token-major
   ids over all ranks orders the assignments partition-major and sender-minor, the ragged dim's
   global order; restricted to one rank it is the rank's local stable sort, so no row moves.
   Its values are global flat positions;
3. ``x.index_select(0, order // k)`` (``ragged/indexing.py``): every row a rank reads is one of its
   own ``Shard(0)`` tokens; backward: ``new_zeros`` + ``index_add`` into ``Shard(0)`` tokens.

:func:`unpermute` is the way back after the combine: ``weights[token, slot]`` of each row (a read),
the weighted rows (lift), and ``new_zeros(T, D).index_add(0, token, rows)`` (a write into
``Shard(0)``: every assignment row of token ``t`` lives on ``t``'s rank in the unaligned layout).
Other mesh dims ride along (``Partial`` over tp after a row-parallel ``w2`` stays ``Partial``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch.distributed.tensor import DTensor, Shard

from dtensor_rules.ragged.placement import RaggedShard
from dtensor_rules.ragged.route import route

__all__ = ["Permutation", "permute", "unpermute"]


class Permutation(NamedTuple):
    """What :func:`unpermute` needs: the sort order and the token layout."""

    order: DTensor  # RaggedShard(0, E, False): global flat assignment index (token * k + slot) of each row
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
    k = ids.shape[1]
    order = torch.argsort(route(ids, num_experts, mesh_dim), stable=True)
    return x.index_select(0, order // k), Permutation(order, k, x)


def unpermute(y: DTensor, perm: Permutation, weights: DTensor) -> DTensor:
    """Unaligned rows ``(T*k, D)`` -> ``Shard(0)`` tokens ``out[t] = sum_j weights[t, j] * y[row of (t, j)]``."""
    tokens = perm.tokens
    mesh_dim = next(i for i, p in enumerate(tokens.placements) if p == Shard(0))
    p = y.placements[mesh_dim]
    if not (isinstance(p, RaggedShard) and not p.aligned and p.dim == 0):
        raise ValueError(f"unpermute needs the rows unaligned (combine them first), got {y.placements}")
    if not isinstance(weights, DTensor) or tuple(weights.placements) != tuple(tokens.placements) or tuple(weights.shape) != (tokens.shape[0], perm.top_k):
        raise ValueError(f"weights must be the (T, k) routing weights laid out like the tokens ({tokens.placements})")
    token, slot = perm.order // perm.top_k, perm.order % perm.top_k
    rows = y * weights[token, slot].to(y.dtype).unsqueeze(-1)
    return rows.new_zeros((tokens.shape[0], *y.shape[1:])).index_add(0, token, rows)

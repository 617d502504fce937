"""``RaggedContext``: the partition sizes of a ragged DTensor, carried as a tensor beside it.

The sizes are the routing matrix ``C`` (``ep x E``, ``C[s][e]`` rows rank ``s`` routes to
expert ``e``) as a DTensor ``Shard(0)`` on the EP mesh dim (rank ``s`` holds its own row: the
per-expert counts its router computed, no communication) and ``Replicate`` on the others.
The context rides on the ragged DTensor as a Python attribute set by the package's moves, so
a placement stays structure only (no cache key per routing) and two forwards in flight never
share sizes. ``recv_counts`` caches what the dispatch's counts all-to-all delivered (column
block ``r`` of ``C``), which the combine reuses.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard

from dtensor_rules._upstream import funcol

__all__ = ["RaggedContext", "attach", "context_of", "make_context", "counts_from_local", "local_counts",
           "full_counts", "received_counts", "group_of"]

_ATTR = "_dtensor_rules_ragged_context"


class RaggedContext(NamedTuple):
    """Partition sizes of a ragged DTensor (see the module docstring)."""

    counts: DTensor  # (ep, E) int64: Shard(0) on mesh_dim, Replicate on every other mesh dim
    mesh_dim: int  # the EP mesh dim the ragged dim is sharded over
    recv_counts: Tensor | None = None  # local (ep * E_l,): per sender, for this rank's experts (after a dispatch)
    # set only on routed ids before their sort (``ragged.route``): the rows are this rank's assignments in
    # TOKEN order, not yet partition-major; this is the rank's first global row in token-major order (0-d
    # int64, per rank). Moves refuse such a tensor (its rows are not yet the layout's order); ``sort`` clears it.
    row_offset: Tensor | None = None

    @property
    def ep(self) -> int:
        return self.counts.device_mesh.size(self.mesh_dim)

    @property
    def num_partitions(self) -> int:
        return self.counts.shape[1]


def attach(dt: DTensor, ctx: RaggedContext) -> DTensor:
    """Hang ``ctx`` on ``dt`` (returned) so later moves of ``dt`` find its sizes."""
    setattr(dt, _ATTR, ctx)
    return dt


def context_of(dt: Any) -> RaggedContext | None:
    """The context a package move left on ``dt``, if any."""
    return getattr(dt, _ATTR, None)


def counts_from_local(local_counts: Tensor, mesh: DeviceMesh, mesh_dim: int) -> DTensor:
    """This rank's ``(E,)`` per-expert counts -> the routing matrix ``C`` as a ``Shard(0)`` DTensor (no communication)."""
    if local_counts.dim() != 1:
        raise ValueError(f"local_counts must be this rank's (E,) per-expert counts, got shape {tuple(local_counts.shape)}")
    placements = [Replicate()] * mesh.ndim
    placements[mesh_dim] = Shard(0)
    ep, E = mesh.size(mesh_dim), local_counts.shape[0]
    return DTensor.from_local(local_counts.to(torch.int64).reshape(1, E), mesh, placements, run_check=False,
                              shape=(ep, E), stride=(E, 1))


def make_context(counts: DTensor, mesh_dim: int, mesh: DeviceMesh) -> RaggedContext:
    """Check ``counts`` is a routing matrix for ``mesh`` and normalise it to ``Shard(0)`` on ``mesh_dim``."""
    if not isinstance(counts, DTensor):
        raise TypeError("counts must be the (ep, E) routing matrix as a DTensor (Shard(0) on the EP mesh dim: "
                        "dtensor_rules.ragged.counts_from_local(this_rank_counts, mesh, mesh_dim) builds it), "
                        f"got {type(counts).__name__}")
    if counts.device_mesh != mesh:
        raise ValueError("counts must live on the same DeviceMesh as the ragged tensor")
    if not 0 <= mesh_dim < mesh.ndim:
        raise ValueError(f"mesh_dim {mesh_dim} out of range for a {mesh.ndim}-D mesh")
    ep = mesh.size(mesh_dim)
    if counts.dim() != 2 or counts.shape[0] != ep or counts.shape[1] % ep:
        raise ValueError(f"counts must be (ep={ep}, E) with E a multiple of ep, got shape {tuple(counts.shape)}")
    if counts.dtype.is_floating_point or counts.dtype.is_complex:
        raise TypeError(f"counts must be integer, got {counts.dtype}")
    others = [p for i, p in enumerate(counts.placements) if i != mesh_dim]
    if not all(p.is_replicate() for p in others) or not (
            counts.placements[mesh_dim].is_replicate() or counts.placements[mesh_dim] == Shard(0)):
        raise ValueError(f"counts must be Shard(0) or Replicate on mesh dim {mesh_dim} and Replicate elsewhere, "
                         f"got {counts.placements}")
    if counts.placements[mesh_dim].is_replicate():
        placements = list(counts.placements)
        placements[mesh_dim] = Shard(0)
        counts = counts.redistribute(mesh, placements)  # a local slice
    return RaggedContext(counts.to(torch.int64), mesh_dim)


def local_counts(ctx: RaggedContext) -> Tensor:
    """This rank's ``(E,)`` row of ``C``."""
    return ctx.counts.to_local().reshape(-1)


def full_counts(ctx: RaggedContext) -> Tensor:
    """The whole ``(ep, E)`` ``C`` on every rank (an all-gather of ``E`` ints per rank)."""
    return ctx.counts.redistribute(placements=[Replicate()] * ctx.counts.device_mesh.ndim).to_local()


def group_of(ctx: RaggedContext) -> str:
    """The EP process group's name (what the custom ops take)."""
    return ctx.counts.device_mesh.get_group(ctx.mesh_dim).group_name


def received_counts(ctx: RaggedContext) -> Tensor:
    """``(ep * E_l,)`` rows this rank's experts receive from each sender: the counts all-to-all (cached)."""
    if ctx.recv_counts is not None:
        return ctx.recv_counts
    ep, row = ctx.ep, local_counts(ctx)
    block = [row.shape[0] // ep] * ep
    return funcol.wait_tensor(funcol.all_to_all_single(row.contiguous(), block, block, group_of(ctx)))

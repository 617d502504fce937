"""The ragged moves on DTensors: dispatch, combine, gather, distribute, and ``redistribute`` over them.

Each move takes the local rows (ragged dim first), runs one custom op of
:mod:`dtensor_rules.ragged.ops` over the EP mesh dim, and wraps the result with the target
placements and the input's global shape (the global row count never depends on the routing).
Autograd flows through ``to_local`` / the op / ``from_local``: the op's backward is the reverse
move, so a gradient comes back in its input's layout. Other mesh dims are untouched (EP x TP:
the tp placements of the rows ride along, since the moves only split the ragged dim).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate

from dtensor_rules._upstream.ragged import RaggedPlacementError, coordinate_tensor
from dtensor_rules.ragged.context import (
    RaggedContext,
    attach,
    context_of,
    full_counts,
    group_of,
    local_counts,
    make_context,
    received_counts,
)
from dtensor_rules.ragged.checkpoint import make_checkpointable
from dtensor_rules.ragged.ops import ragged_all_gather, ragged_exchange, ragged_select
from dtensor_rules.ragged.placement import RaggedShard, is_ragged, ragged_mesh_dims

__all__ = ["dispatch", "combine", "gather", "distribute", "redistribute", "context_for"]


def context_for(x: DTensor, counts: DTensor | None = None, mesh_dim: int | None = None) -> RaggedContext:
    """The sizes of ``x``'s ragged layout: ``counts`` if given, else the context a move left on ``x``."""
    if counts is not None:
        if mesh_dim is None:
            dims = ragged_mesh_dims(x.placements)
            if len(dims) != 1:
                raise ValueError(f"pass mesh_dim: {x.placements} has no single ragged mesh dim")
            mesh_dim = dims[0]
        return make_context(counts, mesh_dim, x.device_mesh)
    ctx = context_of(x)
    if ctx is not None and ctx.row_offset is not None:
        raise RaggedPlacementError(
            "this DTensor holds routed rows in token order (dtensor_rules.ragged.route), not yet in the ragged "
            "layout's partition-major order: sort them first (torch.sort / torch.argsort(stable=True))")
    if ctx is None:
        raise RaggedPlacementError(
            f"this DTensor ({x.placements}) carries no ragged context, so its partition sizes are unknown: pass "
            "counts= (the (ep, E) routing matrix, dtensor_rules.ragged.counts_from_local builds it) or build the "
            "tensor with dtensor_rules.ragged.distribute / from_local")
    if mesh_dim is not None and mesh_dim != ctx.mesh_dim:
        raise ValueError(f"mesh_dim {mesh_dim} differs from the context's EP mesh dim {ctx.mesh_dim}")
    return ctx


def _ragged_at(x: DTensor, ctx: RaggedContext, aligned: bool | None) -> RaggedShard:
    p = x.placements[ctx.mesh_dim]
    if not is_ragged(p) or (aligned is not None and p.aligned != aligned):
        want = "RaggedShard" if aligned is None else f"RaggedShard(aligned={aligned})"
        raise ValueError(f"expected {want} on mesh dim {ctx.mesh_dim}, got {x.placements}")
    if p.num_partitions != ctx.num_partitions:
        raise ValueError(f"{p!r} has {p.num_partitions} partitions but counts has {ctx.num_partitions} experts")
    return p


def grad_placements(placements: Sequence[Placement], mesh_dim: int) -> tuple[Placement, ...]:
    """Gradient layout of a move's input/output: ``Replicate`` on another mesh dim -> ``Partial``.

    A move is linear and only touches ``mesh_dim``, so a gradient that is ``Partial`` over tp (the
    input gradient of a column-parallel expert matmul) travels through it as is; labelling it
    ``Replicate`` would make DTensor all-reduce it here, on the ``k * T`` assignment rows, instead
    of later on the ``T`` tokens. (The gradient of a ``Replicate`` tensor may be ``Partial``; of a
    ``Partial`` one it is ``Replicate``, as upstream's default.)
    """
    return tuple(Partial() if i != mesh_dim and p.is_replicate() else Replicate() if p.is_partial() else p
                 for i, p in enumerate(placements))


def _rows_first(x: DTensor, dim: int, mesh_dim: int) -> Tensor:
    return x.to_local(grad_placements=grad_placements(x.placements, mesh_dim)).movedim(dim, 0)


def _wrap(local_rows_first: Tensor, like: DTensor, dim: int, mesh_dim: int, placement: Placement,
          ctx: RaggedContext) -> DTensor:
    placements = list(like.placements)
    placements[mesh_dim] = placement
    out = DTensor.from_local(local_rows_first.movedim(0, dim), like.device_mesh, placements, run_check=False,
                             shape=like.shape, stride=like.stride(),
                             grad_placements=grad_placements(placements, mesh_dim))
    if is_ragged(placement) and placement.aligned and not torch.compiler.is_compiling():
        make_checkpointable(out, ctx)  # eager only: Dynamo cannot trace binding methods on a tensor
    return attach(out, ctx)


def _exchange(x: DTensor, ctx: RaggedContext, to_aligned: bool) -> DTensor:
    p = _ragged_at(x, ctx, aligned=not to_aligned)
    recv = received_counts(ctx)
    ctx = ctx._replace(recv_counts=recv)
    local = ragged_exchange(_rows_first(x, p.dim, ctx.mesh_dim), local_counts(ctx), recv, ctx.ep, to_aligned,
                            group_of(ctx))
    return _wrap(local, x, p.dim, ctx.mesh_dim, p.with_aligned(to_aligned), ctx)


def dispatch(x: DTensor, counts: DTensor | None = None, mesh_dim: int | None = None) -> DTensor:
    """Unaligned -> aligned: the counts all-to-all (skipped if cached), then the token all-to-all.

    ``x`` holds on each EP rank its own rows sorted by expert (``RaggedShard(d, E, aligned=False)``
    on ``mesh_dim``); the result holds on rank ``r`` every row of experts ``[r*E/ep, (r+1)*E/ep)``,
    expert-major, sender-minor. Same global tensor. Backward: the combine.
    """
    return _exchange(x, context_for(x, counts, mesh_dim), to_aligned=True)


def combine(y: DTensor, counts: DTensor | None = None, mesh_dim: int | None = None) -> DTensor:
    """Aligned -> unaligned: the token all-to-all back (the transposed splits). Backward: the dispatch."""
    return _exchange(y, context_for(y, counts, mesh_dim), to_aligned=False)


def gather(x: DTensor, counts: DTensor | None = None, mesh_dim: int | None = None) -> DTensor:
    """Either ragged layout -> ``Replicate`` on the EP mesh dim (an all-gather with sizes). Backward: a local select."""
    ctx = context_for(x, counts, mesh_dim)
    p = _ragged_at(x, ctx, aligned=None)
    rank = coordinate_tensor(x.device_mesh, ctx.mesh_dim)
    local = ragged_all_gather(_rows_first(x, p.dim, ctx.mesh_dim), full_counts(ctx), ctx.ep, p.aligned,
                              x.shape[p.dim], rank, group_of(ctx))
    return _wrap(local, x, p.dim, ctx.mesh_dim, Replicate(), ctx)


def _select(x: DTensor, ctx: RaggedContext, target: RaggedShard) -> DTensor:
    if not x.placements[ctx.mesh_dim].is_replicate():
        raise ValueError(f"a ragged layout is cut from Replicate on mesh dim {ctx.mesh_dim}, got {x.placements}")
    if target.num_partitions != ctx.num_partitions:
        raise ValueError(f"{target!r} has {target.num_partitions} partitions but counts has {ctx.num_partitions}")
    if x.shape[target.dim] != _total_rows(ctx):
        raise ValueError(f"dim {target.dim} has {x.shape[target.dim]} rows but the counts route {_total_rows(ctx)}")
    rank = coordinate_tensor(x.device_mesh, ctx.mesh_dim)
    local = ragged_select(_rows_first(x, target.dim, ctx.mesh_dim), full_counts(ctx), ctx.ep, target.aligned, rank,
                          group_of(ctx))
    return _wrap(local, x, target.dim, ctx.mesh_dim, target, ctx)


def _total_rows(ctx: RaggedContext) -> int:
    return int(full_counts(ctx).sum().tolist())


def distribute(tensor: Tensor | DTensor, mesh: DeviceMesh, counts: DTensor, mesh_dim: int, *, dim: int = 0,
               aligned: bool = False, placements: Sequence[Placement] | None = None) -> DTensor:
    """A full tensor (or a DTensor ``Replicate`` on ``mesh_dim``) -> ragged on ``mesh_dim`` (a local select).

    ``placements`` (default: Replicate everywhere) gives the other mesh dims; its entry at
    ``mesh_dim`` is replaced by ``RaggedShard(dim, E, aligned)``. Upstream's ``distribute_tensor``
    cannot do this: it re-creates ``Shard(dim)`` and cuts even chunks.
    """
    ctx = make_context(counts, mesh_dim, mesh)
    if not isinstance(tensor, DTensor):
        from torch.distributed.tensor import distribute_tensor

        base = list(placements) if placements is not None else [Replicate()] * mesh.ndim
        base[mesh_dim] = Replicate()
        tensor = distribute_tensor(tensor, mesh, base)
    return _select(tensor, ctx, RaggedShard(dim % tensor.dim(), ctx.num_partitions, aligned))


def _same_elsewhere(a: Sequence[Placement], b: Sequence[Placement], mesh_dim: int) -> bool:
    return all(p == q for i, (p, q) in enumerate(zip(a, b)) if i != mesh_dim)


def _upstream_redistribute(x: DTensor, placements: Sequence[Placement], **kwargs: Any) -> DTensor:
    """Neither side ragged: upstream's method (the ragged_redistribute patch passes such calls through)."""
    return x.redistribute(x.device_mesh, placements, **kwargs)


def redistribute(x: DTensor, placements: Sequence[Placement], counts: DTensor | None = None,
                 **kwargs: Any) -> DTensor:
    """``x.redistribute(placements=...)`` where either side is ragged on one mesh dim.

    Runs the ragged move on that mesh dim (dispatch, combine, gather or select) and upstream's
    redistribute for the other mesh dims (before a select, after a gather). Ragged -> ``Shard`` or
    ``Partial`` goes through Replicate. Needs the sizes: the tensor's context, or ``counts=``.
    """
    placements = tuple(placements)
    if len(placements) != x.device_mesh.ndim:
        raise ValueError(f"{len(placements)} placements for a {x.device_mesh.ndim}-D mesh")
    dims = sorted(set(ragged_mesh_dims(x.placements)) | set(ragged_mesh_dims(placements)))
    if len(dims) != 1:
        raise RaggedPlacementError(f"a ragged dim is sharded over exactly one mesh dim; {x.placements} -> "
                                   f"{placements} has ragged placements on mesh dims {dims}")
    m = dims[0]
    src, dst = x.placements[m], placements[m]
    if src == dst:
        if _same_elsewhere(x.placements, placements, m):
            return x
        raise RaggedPlacementError(f"{x.placements} -> {placements}: changing other mesh dims while one stays "
                                   "ragged is not supported; gather the ragged mesh dim first")
    ctx = context_for(x, counts, m)
    if is_ragged(src) and is_ragged(dst):
        if not _same_elsewhere(x.placements, placements, m) or src.dim != dst.dim:
            raise RaggedPlacementError(f"{x.placements} -> {placements}: a dispatch/combine keeps the tensor dim "
                                       "and every other mesh dim")
        return _exchange(x, ctx, to_aligned=dst.aligned)
    if is_ragged(src):  # -> Replicate on m, then the rest upstream
        out = gather(x, ctx.counts, m)
        if tuple(out.placements) == placements:
            return out
        return attach(_upstream_redistribute(out, placements, **kwargs), ctx)
    before = list(placements)
    before[m] = Replicate()
    if tuple(x.placements) != tuple(before):
        x = _upstream_redistribute(x, before, **kwargs)
    return _select(x, ctx, dst)

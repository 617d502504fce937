"""``gather`` with self sharded along the gather dim: each rank looks up what it holds, no all-gather.

The strategy ``[out, self, index] = [M, Shard(dim), M]`` (``M`` an :class:`IndexMaskPartial`)
is upstream's masked-partial gather. Its mask is made here, at dispatch, instead of in a
buffer shared through DTensor's sharding cache (``_upstream/mask.py`` says why). When
DTensor's propagation picks the strategy (in the cache-miss callback, ``dispatch/cache_miss.py``)
:func:`finish_masked_gather` computes the result, so the choice is never cached:

1. the index is brought to Replicate on the mesh dims where the strategy masks it (it usually
   is already: no communication), every other input as the strategy says;
2. each rank's chunk of self along ``dim`` is found over all those mesh dims (nested in
   mesh-dim order, as DTensor cuts the chunks; uneven and empty chunks included);
3. the index is moved into the chunk, entries outside it point at 0; the local gather runs
   (on one zero slice where the chunk is empty) and those entries' results are zeroed;
4. the result is wrapped as the strategy's output: a Partial sum of disjoint lookups.

An index outside ``[0, self.size(dim))`` fails an asynchronous assert, as torch's own gather
fails, instead of being masked on every rank into a silent 0. The row is offered only where
the callback can finish it (a full ``install()``; or no install at all, to queries), so
``install(ops=[gather])`` alone keeps the all-gather strategies, and only where the result's
later reduction cannot move more than the all-gather it saves (:func:`mask_row_pays`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.placement_types import Placement, Replicate, Shard

from dtensor_rules import registry
from dtensor_rules._upstream import (
    DTensorSpec,
    IndexMaskPartial,
    assert_async,
    dispatch_propagated,
    enabled_local_tensor_mode,
    input_targets,
    maybe_run_for_local_tensor,
    mesh_coordinate,
    redistribute_args_to,
    wrap_result,
)
from dtensor_rules.dispatch.finishers import finish_on_miss, finishing
from dtensor_rules.op_rules._common import normalize_dim, size_is, sym_numel

__all__ = ["finish_masked_gather", "mask_row", "mask_row_offered", "mask_row_pays"]

GATHER = torch.ops.aten.gather.default


def mask_row_offered() -> bool:
    """Can a chosen masked strategy be finished? (Queries with nothing installed see the row too.)"""
    return finishing() or GATHER not in registry.active_ops()


def mask_row_pays(dim: int, self_shape: Sequence[Any], index_shape: Sequence[Any]) -> bool:
    """Offer the row where reducing its result later moves no more than all-gathering self now.

    DTensor prices a strategy by its inputs' redistribution only: the masked result costs
    nothing now, but its reduction (an all-reduce of the index's size, about twice the bytes of
    an all-gather of as many elements) comes later. So: at most half as many lookups as self
    has elements (``2 * index.numel() <= self.numel()``, statically known; symbolic sizes are
    never guarded on), or one lookup per row (``index.size(dim) == 1``: upstream's own
    condition, which implies it once self is split at all).
    """
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    if size_is(index_shape[dim], 1):
        return True
    return statically_known_true(2 * sym_numel(index_shape) <= sym_numel(self_shape))


def mask_row(dim: int, self_shape: Sequence[Any]) -> list[Placement]:
    """``[out, self, index]``: self sharded on ``dim``, index and output masked (the module doc)."""
    mask = IndexMaskPartial(offset_shape=tuple(self_shape), offset_dim=dim)
    return [mask, Shard(dim), mask]


def _chunk(size: Any, mesh: DeviceMesh, mesh_dims: tuple[int, ...]) -> tuple[Any, Any]:
    """(size, offset) of this rank's chunk of a dim of ``size`` sharded over ``mesh_dims``, in order
    (per simulated rank under LocalTensorMode, symbolic while tracing)."""
    offset: Any = 0
    for k in mesh_dims:
        size, start = Shard.local_shard_size_and_offset(size, mesh.size(k), mesh_coordinate(mesh, k))
        offset = offset + start
    return size, offset


@functools.lru_cache(maxsize=256)
def _chunk_at(size: int, sizes: tuple[int, ...], coordinate: tuple[int, ...]) -> tuple[int, int]:
    """(size, offset) of the chunk at ``coordinate`` (one entry per mesh dim that splits the dim, in
    order) of a dim of ``size`` split over mesh dims of ``sizes``.

    The key is the coordinate itself, never the mesh: meshes compare and hash equal across ranks
    and across process groups (the threaded process group runs every rank as a thread of one
    process and recycles thread ids), so a mesh-keyed cache hands one rank another rank's chunk.
    """
    offset = 0
    for n, c in zip(sizes, coordinate):
        size, start = Shard.local_shard_size_and_offset(size, n, c)
        offset += start
    return size, offset


def _chunk_of_this_rank(size: int, mesh: DeviceMesh, mesh_dims: tuple[int, ...]) -> tuple[int, int]:
    """:func:`_chunk` on a real rank with concrete sizes, memoized on this rank's coordinate."""
    coordinate = mesh.get_coordinate()
    return _chunk_at(size, tuple(mesh.size(k) for k in mesh_dims), tuple(coordinate[k] for k in mesh_dims))


def _index_target(spec: DTensorSpec, mask_dims: tuple[int, ...]) -> DTensorSpec:
    """The index's layout with Replicate where the strategy masks it (on the call's own mesh)."""
    placements = tuple(Replicate() if k in mask_dims else p for k, p in enumerate(spec.placements))
    return DTensorSpec(spec.mesh, placements, tensor_meta=spec.tensor_meta)


@maybe_run_for_local_tensor
def _masked_index(index: torch.Tensor, size: int, offset: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank-local: the index moved into the chunk ``[offset, offset + size)``, and where it was outside."""
    mask = (index < offset) | (index >= offset + size)
    return (index - offset).masked_fill(mask, 0), mask


@maybe_run_for_local_tensor
def _nonempty(table: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    """Rank-local: ``table``, or one zero slice along ``dim`` where the rank's chunk is empty."""
    if size > 0:
        return table
    shape = list(table.shape)
    shape[dim] = 1
    return table.new_zeros(shape)


def finish_masked_gather(op: Any, args: Any, kwargs: Any, op_info: Any, sharding: Any) -> Any:
    """The result of a ``gather`` call whose chosen strategy masks the index; None for any other."""
    op_info.output_sharding = sharding
    targets = input_targets(op_info)
    index_spec = targets[2]
    mask_dims = tuple(k for k, p in enumerate(index_spec.placements) if isinstance(p, IndexMaskPartial))
    if not mask_dims:
        return None
    mesh = index_spec.mesh
    if mesh.get_coordinate() is None:  # a rank outside the mesh computes nothing: upstream's path
        return dispatch_propagated(op, args, op_info)
    targets[2] = _index_target(index_spec, mask_dims)
    redistribute_args_to(op_info, targets)
    table, dim, index, *rest = op_info.local_args
    full = targets[0].shape
    dim = normalize_dim(dim, len(full))
    assert_async(
        ((index >= 0) & (index < full[dim])).all(),
        f"gather(): index out of bounds for dimension {dim} with size {full[dim]}",
    )
    if enabled_local_tensor_mode() or not isinstance(full[dim], int):  # per simulated rank, or symbolic
        size, offset = _chunk(full[dim], mesh, mask_dims)
    else:
        size, offset = _chunk_of_this_rank(full[dim], mesh, mask_dims)
    local_index, mask = _masked_index(index, size, offset)
    out = op(_nonempty(table, dim, size), dim, local_index, *rest, **op_info.local_kwargs)
    return wrap_result(out.masked_fill(mask, 0), sharding.output_spec)


finish_on_miss(GATHER, finish_masked_gather)

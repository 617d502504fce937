"""``x[mask]`` on DTensors: the cache-miss handler of ``aten.index.Tensor`` with a bool index.

DTensor's fake-tensor meta step cannot size ``x[mask]`` (``aten.nonzero`` has a data-dependent
shape), so such a call always misses DTensor's sharding cache. The handler checks each mask's
shape against the dims it covers (torch's ``IndexError`` otherwise), replicates the mask and
turns it into the long indices it stands for (:func:`masks_to_indices`), then runs upstream's
Python dispatch path with them; its return value is the op's result. Every other call of the
op — ordinary long indices included — goes on to DTensor's own callback, and after its first
(cache-filling) call stays on DTensor's C++ fast path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.placement_types import Replicate

from dtensor_rules._upstream import CacheMissCall, dispatch_slow_path
from dtensor_rules.dispatch.miss_handlers import on_miss

__all__ = ["check_mask_shapes", "is_mask", "masks_to_indices"]

INDEX = torch.ops.aten.index.Tensor


def is_mask(x: object) -> bool:
    return isinstance(x, torch.Tensor) and x.dtype in (torch.bool, torch.uint8)


def check_mask_shapes(self_shape: Sequence[int], indices: Sequence[object]) -> None:
    """torch's ``IndexError`` for a mask whose shape differs from the self dims it covers."""
    cursor = 0
    for idx in indices:
        if is_mask(idx):
            mask_shape = list(idx.shape)  # type: ignore[union-attr]
            n = len(self_shape)
            for j, size in enumerate(mask_shape):
                if cursor + j >= n:
                    raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {cursor + j})")
                if size != self_shape[cursor + j]:
                    raise IndexError(
                        f"The shape of the mask {mask_shape} at index {j} does not match the shape of the "
                        f"indexed tensor {list(self_shape)} at index {cursor + j}"
                    )
            cursor += len(mask_shape)
        else:
            cursor += 1


def _replicated(x: DTensor) -> DTensor:
    """``x`` replicated on every mesh dim, one mesh dim per redistribute, minor first.

    The collectives are the ones upstream runs for a single all-Replicate redistribute, in the same
    order, but that call would also log a warning in the user's script that its sequential
    all_gathers could be one on a flattened mesh.
    """
    placements = list(x.placements)
    for m in reversed(range(x.device_mesh.ndim)):
        if placements[m] != Replicate():
            placements[m] = Replicate()
            x = x.redistribute(x.device_mesh, placements)
    return x


def masks_to_indices(indices: list[object]) -> list[object]:
    """Replace each bool mask in an index list by the long index tensors it stands for.

    ``x[mask]`` is ``x[mask.nonzero().unbind(1)]`` (torch expands masks the same way). The
    mask is replicated first, so every rank computes the same coordinates locally and the
    long indices are Replicate DTensors of identical shape on every rank.
    """
    out: list[object] = []
    for idx in indices:
        if not is_mask(idx):
            out.append(idx)
            continue
        if not isinstance(idx, DTensor):
            raise RuntimeError("aten.index.Tensor: a plain-tensor bool mask mixed with DTensors; make it a DTensor")
        mesh = idx.device_mesh
        full = _replicated(idx).to_local()
        for coord in full.bool().nonzero(as_tuple=True):
            out.append(DTensor.from_local(coord, mesh, [Replicate()] * mesh.ndim, run_check=False))
    return out


def index_with_masks(call: CacheMissCall, original: Callable[..., Any]) -> Any:
    """The cache-miss handler of ``aten.index.Tensor``: masks as long indices; any other index to DTensor."""
    args = call.args
    if len(args) > 1 and isinstance(args[1], (list, tuple)) and any(is_mask(i) for i in args[1]):
        check_mask_shapes(tuple(args[0].shape), args[1])
        return dispatch_slow_path(call.op_call, (args[0], masks_to_indices(list(args[1])), *args[2:]), call.kwargs)
    return call.run(original)


on_miss(INDEX, index_with_masks)

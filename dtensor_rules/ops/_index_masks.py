"""``x[mask]`` on DTensors: bool masks of ``aten.index.Tensor`` without a per-call handler.

DTensor's fake-tensor meta step cannot size ``x[mask]`` (``aten.nonzero`` has a data-dependent
shape), so such a call always misses DTensor's sharding cache. The ``index_bool_masks`` patch
(applied by ``dtensor_rules.install()``) wraps the dispatcher's cache-miss callback: for
``index.Tensor`` with a bool/uint8 index it checks each mask's shape against the dims it covers
(torch's ``IndexError`` otherwise), replicates the mask and turns it into the long indices it
stands for (:func:`masks_to_indices`), then runs upstream's Python dispatch path with them; its
return value is the op's result. Every other call — ordinary long indices included — never
reaches this code after its first (cache-filling) call, so it stays on DTensor's C++ fast path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.placement_types import Replicate

from dtensor_rules._upstream import dispatch_slow_path, unwrap_cache_miss, wrap_cache_miss

__all__ = ["is_mask", "check_mask_shapes", "masks_to_indices"]

_INDEX = torch.ops.aten.index.Tensor


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
        full = idx.redistribute(mesh, [Replicate()] * mesh.ndim).to_local()
        for coord in full.bool().nonzero(as_tuple=True):
            out.append(DTensor.from_local(coord, mesh, [Replicate()] * mesh.ndim, run_check=False))
    return out


def _with_masks(original: Callable[..., Any]) -> Callable[..., Any]:
    def on_cache_miss(op_call: Any, args: Any, kwargs: Any, *rest: Any) -> Any:
        if op_call is _INDEX and len(args) > 1 and isinstance(args[1], (list, tuple)) and any(is_mask(i) for i in args[1]):
            check_mask_shapes(tuple(args[0].shape), args[1])
            return dispatch_slow_path(op_call, (args[0], masks_to_indices(list(args[1])), *args[2:]), kwargs)
        return original(op_call, args, kwargs, *rest)

    return on_cache_miss


def _register() -> None:
    from dtensor_rules.registry import register_patch

    register_patch("index_bool_masks", lambda: wrap_cache_miss(_with_masks), unwrap_cache_miss)


_register()

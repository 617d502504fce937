"""What DTensor's sharding-cache-miss callback does for our ops: ``x[mask]``, ``out=`` errors, finishers.

1. ``x[mask]`` on DTensors: bool masks of ``aten.index.Tensor`` without a per-call handler.

DTensor's fake-tensor meta step cannot size ``x[mask]`` (``aten.nonzero`` has a data-dependent
shape), so such a call always misses DTensor's sharding cache. The ``cache_miss_hook`` patch
(applied by ``dtensor_rules.install()``) wraps the dispatcher's cache-miss callback: for
``index.Tensor`` with a bool/uint8 index it checks each mask's shape against the dims it covers
(torch's ``IndexError`` otherwise), replicates the mask and turns it into the long indices it
stands for (:func:`masks_to_indices`), then runs upstream's Python dispatch path with them; its
return value is the op's result. Every other call — ordinary long indices included — never
reaches this code after its first (cache-filling) call, so it stays on DTensor's C++ fast path.

2. ``op(..., out=o)`` where no strategy of our rule produces ``o``'s layout (``cumsum(x, d, out=o)``
   with ``o`` sharded on the scan dim: a carry across ranks): upstream's selection fails with
   "min() arg is an empty sequence" (2.13) or "no valid sharding strategy" (2.14). The hook re-raises a RuntimeError naming the out= layout,
   the layouts our rule can produce per mesh dim, and the fix.

3. Finishers (:func:`finish_on_miss`): an op whose chosen strategy dispatch cannot run as is
   (``gather`` with a masked index: ``ops/gather_mask.py``) computes its result here from the
   sharding just chosen; the result is not a sharding, so DTensor caches nothing and every call
   like it comes back here, while the op's other layouts are cached and stay on the fast path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.placement_types import Replicate

from torch.utils import _pytree as pytree

from dtensor_rules._upstream import (
    cache_miss_wrapped,
    dispatch_slow_path,
    is_output_sharding,
    spec_of,
    unwrap_cache_miss,
    wrap_cache_miss,
)

__all__ = ["is_mask", "check_mask_shapes", "masks_to_indices", "finish_on_miss", "finishing"]

_INDEX = torch.ops.aten.index.Tensor
# op -> finish(op_call, args, kwargs, op_info, sharding): the call's result, or None to let DTensor
# cache the sharding and run it
_FINISHERS: dict[Any, Callable[..., Any]] = {}


def finish_on_miss(op: Any, finish: Callable[..., Any]) -> None:
    """Register ``finish`` for ``op`` (point 3 of the module doc)."""
    _FINISHERS[op] = finish


def finishing() -> bool:
    """Whether the cache-miss hook, and so every finisher, is in effect (a full ``install()``)."""
    return cache_miss_wrapped()


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


def _out_layout_error(op_call: Any, args: tuple[Any, ...], kwargs: dict[str, Any], err: Exception) -> RuntimeError | None:
    """A clear error when ``err`` is selection over an empty strategy list for an out= call of ours."""
    from dtensor_rules import registry

    outs = {a.name for a in op_call._schema.arguments if a.is_out}
    out = [v for k, v in kwargs.items() if k in outs and isinstance(v, DTensor)]
    cause = err.__cause__ or err
    # torch 2.13: min() over no strategies ("empty sequence"); torch 2.14 says "no valid sharding strategy"
    nothing_fits = (isinstance(cause, ValueError) and "empty sequence" in str(cause)) or any(
        "no valid sharding strategy" in str(e) for e in (err, cause))
    if not out or not nothing_fits or op_call not in registry.rules():
        return None
    rule = registry.rules()[op_call]
    offered = "R"
    if rule.kind == "single_dim":
        metas = pytree.tree_map(lambda x: spec_of(x).tensor_meta if isinstance(x, DTensor) else x, (tuple(args), kwargs))
        rows = rule.strategy(op_call, *metas)
        offered = ", ".join(sorted({"R"} | {f"S({r[0].dim})" if hasattr(r[0], "dim") else str(r[0]) for r in rows}))
    layout = ", ".join(str(tuple(o.placements)) for o in out)
    return RuntimeError(
        f"{op_call}: no strategy of its rule writes an output laid out like the out= DTensor ({layout}); per mesh dim "
        f"the result can be one of [{offered}]. Pass an out= DTensor with such a layout, or call the functional op "
        f"and redistribute its result."
    )


def _on_miss(original: Callable[..., Any]) -> Callable[..., Any]:
    def on_cache_miss(op_call: Any, args: Any, kwargs: Any, *rest: Any) -> Any:
        if not kwargs and op_call is not _INDEX and op_call not in _FINISHERS:
            return original(op_call, args, kwargs, *rest)  # nothing of ours to do: straight through
        if op_call is _INDEX and len(args) > 1 and isinstance(args[1], (list, tuple)) and any(is_mask(i) for i in args[1]):
            check_mask_shapes(tuple(args[0].shape), args[1])
            return dispatch_slow_path(op_call, (args[0], masks_to_indices(list(args[1])), *args[2:]), kwargs)
        finish = _FINISHERS.get(op_call)
        if finish is not None and len(rest) == 2:
            # DTensor never caches a finished call, so it asks again every time and says "don't
            # look in the Python cache" (its own would have had it): look there, or every such
            # call would price every strategy again
            rest = (rest[0], True)
        try:
            result = original(op_call, args, kwargs, *rest)
        except RuntimeError as err:
            clear = _out_layout_error(op_call, tuple(args), kwargs, err) if kwargs else None
            if clear is not None:
                raise clear from err
            raise
        if finish is None or not rest or not is_output_sharding(result):
            return result
        done = finish(op_call, args, kwargs, rest[0], result)
        return result if done is None else done

    return on_cache_miss


def _register() -> None:
    from dtensor_rules.patches import Patch, register

    register(Patch(
        name="cache_miss_hook",
        apply=lambda: wrap_cache_miss(_on_miss),
        restore=unwrap_cache_miss,
        changes="DTensor._op_dispatcher._propagate_op_sharding_dispatch_slow_path (an instance attribute "
        "shadowing the method): the callback DTensor's C++ dispatch calls on a sharding-cache miss",
        reason="x[mask] on DTensors, a clear error for an out= layout no strategy writes, and the finishers "
        "(gather with a masked index) run here; every cached call stays on DTensor's C++ fast path",
        upstream="missing: DTensor has no way to run an op whose output size depends on the data: x[bool_mask] "
        "(aten.index.Tensor with a bool index) on DTensors raises (checked: torch 2.13.0, 2.14.1)",
        required=True,
    ))


_register()

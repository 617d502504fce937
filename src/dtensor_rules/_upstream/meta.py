"""Fake tensors and meta kernels: shapes without data."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from torch._subclasses.fake_tensor import DynamicOutputShapeException, FakeTensor, FakeTensorMode

__all__ = [
    "DynamicOutputShapeException",
    "FAKE_TENSOR_LOGGER",
    "META_FAILURE_MESSAGE",
    "FakeTensor",
    "FakeTensorMode",
    "create_grouped_mm_output_tensor",
    "ensure_prims_fma",
    "on_prims_fma_defined",
    "prims_fma_defined",
    "unbacked_size",
]


def unbacked_size() -> Any:
    """A new unbacked row count for a custom op's fake implementation, under any Dynamo config.

    ``torch.library.get_ctx().new_dynamic_size()`` refuses (``DynamicOutputShapeException``, a graph
    break) unless ``capture_dynamic_output_shape_ops`` or ``fullgraph=True``: a guard for ops whose
    kernels cannot run with data-dependent sizes. Upstream's own distributed op with a
    data-dependent output (``device_mesh::_runtime_compute_coordinate_on_dim``) skips that check
    the same way: create the unbacked SymInt on the context's shape env and mark it a size.
    Without a shape env (plain fake mode, e.g. ``opcheck`` or DTensor's propagation) it raises
    like ``new_dynamic_size``.
    """
    import torch
    from torch.fx.experimental.symbolic_shapes import _constrain_range_for_size

    ctx = torch.library.get_ctx()
    if not hasattr(ctx, "_shape_env"):  # a renamed private: the public call (needs the Dynamo setting)
        return ctx.new_dynamic_size()
    shape_env = ctx._shape_env
    if shape_env is None:
        raise DynamicOutputShapeException(getattr(ctx, "_op", None))
    size = shape_env.create_unbacked_symint()
    _constrain_range_for_size(size, min=0)
    return size


def create_grouped_mm_output_tensor(mat_a: Any, mat_b: Any, offs: Any, out_dtype: Any) -> Any:
    """``_grouped_mm``'s output (shape, strides, dtype) as its meta kernel builds it."""
    from torch._meta_registrations import _create_grouped_mm_output_tensor

    return _create_grouped_mm_output_tensor(mat_a, mat_b, offs, out_dtype)


def ensure_prims_fma() -> None:
    """Define ``torch.ops.prims.fma`` (inductor defines it; importing inductor costs ~2 s)."""
    import torch._inductor.inductor_prims  # noqa: F401


_INDUCTOR_PRIMS = "torch._inductor.inductor_prims"
_fma_callbacks: list[Callable[[], None]] = []


def prims_fma_defined() -> bool:
    """Whether ``torch.ops.prims.fma`` exists yet (without importing inductor)."""
    return _INDUCTOR_PRIMS in sys.modules and hasattr(sys.modules[_INDUCTOR_PRIMS], "fma")


def on_prims_fma_defined(callback: Callable[[], None]) -> Callable[[], None]:
    """Run ``callback`` now if ``prims.fma`` exists, else right after inductor defines it; returns
    ``cancel()`` (forgets a callback still waiting; upstream's function is back once none waits).

    Upstream registers its own fma sharding rule the same lazy way: ``inductor_prims`` calls
    ``_pointwise_ops.register_inductor_prims()`` after ``make_prim("fma...")``. We wrap that
    function, so our callbacks run right after upstream's registration, and never import
    inductor ourselves. Callbacks run at someone else's import: they must not raise
    (``dtensor_rules.patches.guarded``).
    """
    if prims_fma_defined():
        callback()
        return lambda: None
    import torch.distributed.tensor._ops._pointwise_ops as pointwise

    if not _fma_callbacks:
        original = pointwise.register_inductor_prims

        def register_inductor_prims() -> None:
            original()
            _unwrap(pointwise, original)  # once: later imports see upstream's function
            callbacks, _fma_callbacks[:] = list(_fma_callbacks), []
            for cb in callbacks:
                cb()

        _wrapper.update(original=original, wrapper=register_inductor_prims)
        pointwise.register_inductor_prims = register_inductor_prims
    _fma_callbacks.append(callback)

    def cancel() -> None:
        if callback in _fma_callbacks:
            _fma_callbacks.remove(callback)
        if not _fma_callbacks and _wrapper:
            _unwrap(pointwise, _wrapper["original"])

    return cancel


_wrapper: dict[str, Callable[[], None]] = {}  # while callbacks wait: upstream's function and our wrapper


def _unwrap(pointwise: Any, original: Callable[[], None]) -> None:
    """Put upstream's ``register_inductor_prims`` back, unless someone wrapped ours since (then theirs stays)."""
    if pointwise.register_inductor_prims is _wrapper.get("wrapper"):
        pointwise.register_inductor_prims = original
    _wrapper.clear()


# the logger FakeTensorMode reports a failing meta kernel on (at ERROR, with a traceback)
FAKE_TENSOR_LOGGER = "torch._subclasses.fake_tensor"
META_FAILURE_MESSAGE = "failed while attempting to run meta for %s"

"""Tensor helpers for cost formulas: element counts, distinct bytes, data availability, arg binding."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch._ops import OpOverload


class CostError(ValueError):
    """A cost cannot be computed: unknown op, hardware or dtype, or malformed arguments."""


def numel(t: Any) -> int:
    """Elements of a tensor or of a shape."""
    shape = t.shape if hasattr(t, "shape") else t
    return math.prod(int(s) for s in shape)


def itemsize(dtype: torch.dtype) -> int:
    return dtype.itemsize


def nbytes(t: Any) -> int:
    """Bytes of the distinct memory a tensor's elements occupy (stride-0 dims count once).

    Works for anything with ``shape``/``stride()``/``dtype`` (tensors, fake and meta tensors);
    an object without strides (e.g. a TensorMeta) is taken as contiguous.
    """
    shape = tuple(int(s) for s in t.shape)
    strides = tuple(t.stride()) if callable(getattr(t, "stride", None)) else tuple(getattr(t, "stride", ()) or ())
    if len(strides) != len(shape):
        strides = (1,) * len(shape)
    n = 1
    for size, stride in zip(shape, strides):
        if size == 0:
            return 0
        if stride != 0:
            n *= size
    return n * t.dtype.itemsize


def broadcast_shape(*shapes: Sequence[int]) -> tuple[int, ...]:
    return tuple(torch.broadcast_shapes(*[torch.Size(s) for s in shapes]))


def is_concrete(t: Any) -> bool:
    """True when a tensor's values can be read (not meta, not fake, not a tracing proxy)."""
    if not isinstance(t, torch.Tensor):
        return False
    if t.device.type == "meta":
        return False
    from dtensor_rules._upstream import FakeTensor

    if isinstance(t, FakeTensor):
        return False
    if type(t) is not torch.Tensor and not isinstance(t, torch.nn.Parameter):
        return False  # subclasses (DTensor, LocalTensor, functional) may not hold plain data
    return True


def dim_size(t: Any, dim: int) -> int:
    nd = len(t.shape)
    if nd == 0:
        return 1
    if not -nd <= dim < nd:
        raise CostError(f"dim {dim} out of range for a {nd}-d tensor")
    return int(t.shape[dim])


def bind(op: OpOverload, args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Map ``op``'s schema argument names to the given values (defaults filled in).

    Raises :class:`CostError` when the call does not fit the schema.
    """
    params = op._schema.arguments
    positional = [p for p in params if not p.kwarg_only]
    if len(args) > len(positional):
        raise CostError(f"{op} takes {len(positional)} positional arguments, got {len(args)}")
    out: dict[str, Any] = {p.name: a for p, a in zip(positional, args)}
    names = {p.name for p in params}
    for k, v in kwargs.items():
        if k not in names:
            raise CostError(f"{op} has no argument {k!r} (schema: {op._schema})")
        if k in out:
            raise CostError(f"{op} got argument {k!r} twice")
        out[k] = v
    for p in params:
        if p.name in out:
            continue
        if p.has_default_value():
            out[p.name] = p.default_value
        elif p.kwarg_only and isinstance(p.type, torch.OptionalType):
            out[p.name] = None
        else:
            raise CostError(f"{op} is missing argument {p.name!r} (schema: {op._schema})")
    return out


def fits(op: OpOverload, args: Sequence[Any], kwargs: dict[str, Any]) -> bool:
    """Whether a call fits ``op``'s schema, tensors where tensors go (used to pick an overload)."""
    try:
        bound = bind(op, args, kwargs)
    except CostError:
        return False
    for p in op._schema.arguments:
        v = bound.get(p.name)
        t = p.type
        if isinstance(t, torch.OptionalType):
            if v is None:
                continue
            t = t.getElementType()
        if isinstance(t, torch.TensorType) != isinstance(v, torch.Tensor):
            return False
        if isinstance(t, torch.ListType) and not isinstance(v, (list, tuple)):
            return False
    return True


def first_float_dtype(tensors: Sequence[Any]) -> torch.dtype | None:
    ts = [t for t in tensors if isinstance(t, torch.Tensor)]
    for t in ts:
        if t.dtype.is_floating_point:
            return t.dtype
    return ts[0].dtype if ts else None

"""Turn a user's simple ``flops=`` / ``bytes=`` callables into one cost formula.

``register(op, flops=f, bytes=g)`` is the short form for custom ops: ``f(*args, **kwargs) -> int``
and ``g(*args, **kwargs) -> int | (read, written) | OpCost``. The registry converts them here,
once, at registration, so every rule carries a single ``cost`` formula and estimate never asks
which kind of callable it holds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._ops import OpOverload

from dtensor_rules.costs._util import CostError, first_float_dtype
from dtensor_rules.costs.op_cost import Formula, OpCost, _tensors

__all__ = ["from_flops_bytes"]


def _bytes(op: OpOverload, value: Any) -> tuple[int, int, str]:
    """(read, written, note) from what a ``bytes=`` callable returned."""
    if isinstance(value, OpCost):
        return value.bytes_read, value.bytes_written, ""
    if isinstance(value, tuple) and len(value) == 2:
        return int(value[0]), int(value[1]), ""
    if isinstance(value, int):
        return int(value), 0, "rule gave total bytes: counted as bytes_read"
    raise CostError(f"bytes formula of the rule for {op} returned {value!r}: expected int, (read, written) or OpCost")


def from_flops_bytes(
    flops: Callable[..., int] | None, bytes: Callable[..., Any] | None  # noqa: A002 - the register() keyword
) -> Formula:
    """One formula ``(op, args, kwargs) -> OpCost`` (``source="rule"``); a missing half counts 0, noted."""

    def cost(op: OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> OpCost:
        notes = []
        n_flops = 0
        if flops is not None:
            n_flops = int(flops(*args, **kwargs))
        else:
            notes.append("rule gave no flops formula: 0 assumed")
        read = written = 0
        if bytes is not None:
            read, written, note = _bytes(op, bytes(*args, **kwargs))
            notes += [note] if note else []
        else:
            notes.append("rule gave no bytes formula: 0 assumed")
        if n_flops < 0 or read < 0 or written < 0:
            raise CostError(f"cost formula of the rule for {op} returned a negative cost")
        tensors: list[torch.Tensor] = _tensors(args, kwargs)
        return OpCost(
            n_flops, read, written, dtype=first_float_dtype(tensors), exact=not notes, source="rule",
            note="; ".join(notes),
        )

    cost.__name__ = getattr(flops, "__name__", None) or getattr(bytes, "__name__", "cost")
    cost.__doc__ = "; ".join(f.__doc__.strip() for f in (flops, bytes) if f is not None and f.__doc__)
    return cost

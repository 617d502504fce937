"""``OpCost``, the ``Formula`` type and the helpers formulas share (meta outputs, tensor leaves).

What one op call costs in arithmetic and memory traffic; :mod:`dtensor_rules.costs.estimator`
picks the formula for a call. This module imports no other cost module, so every formula
module can import it without a circle.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import torch
from torch._ops import OpOverload, OpOverloadPacket

from dtensor_rules.costs._util import CostError, fits

__all__ = ["OpCost", "CostError", "Formula", "resolve_overload", "meta_call", "run_on_meta"]

Unit = Literal["tensor", "vector"]


@dataclass(frozen=True)
class OpCost:
    """Arithmetic ops and bytes moved by one op call.

    ``flops`` counts arithmetic operations of any dtype (float, integer, comparisons),
    a multiply-add being 2. ``unit`` says which hardware unit does them: ``"tensor"``
    (matrix engines: tensor cores, AMX) or ``"vector"`` (ALUs). ``dtype`` is the dtype the
    arithmetic runs in. ``exact`` is False when a data-dependent quantity was assumed.
    ``family`` names the kind of kernel (``matmul``, ``pointwise``, ``reduction``, ``copy``,
    ``gather``, ``scatter``, ``sort``, ``scan``, ``histogram``, ``factory``, ``view``): a
    hardware profile may carry a per-family efficiency (``Hardware.family_efficiency``).
    """

    flops: int
    bytes_read: int
    bytes_written: int
    dtype: torch.dtype | None = None
    unit: Unit = "vector"
    exact: bool = True
    source: str = "table"
    note: str = ""
    family: str = ""

    @property
    def bytes(self) -> int:
        return self.bytes_read + self.bytes_written

    def __add__(self, other: OpCost) -> OpCost:
        return OpCost(
            self.flops + other.flops,
            self.bytes_read + other.bytes_read,
            self.bytes_written + other.bytes_written,
            self.dtype or other.dtype,
            "tensor" if "tensor" in (self.unit, other.unit) else "vector",
            self.exact and other.exact,
            self.source if self.source == other.source else f"{self.source}+{other.source}",
            "; ".join(n for n in (self.note, other.note) if n),
            self.family if self.family == other.family else "mixed",
        )


Formula = Callable[[OpOverload, tuple[Any, ...], dict[str, Any]], OpCost]
"""A cost formula: ``formula(op, args, kwargs) -> OpCost`` for one call (``Rule.cost``)."""


def resolve_overload(op: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> OpOverload:
    """An ``OpOverload`` as is; for an overload packet, the overload whose schema the call fits."""
    if isinstance(op, OpOverload):
        return op
    inner = getattr(op, "_opoverload", None)  # torch.library.CustomOpDef
    if isinstance(inner, OpOverload):
        return inner
    if isinstance(op, OpOverloadPacket):
        for name in op.overloads():
            overload = getattr(op, name)
            if fits(overload, args, kwargs):
                return overload
        raise CostError(f"no overload of {op} fits the given arguments ({', '.join(op.overloads())} exist)")
    raise CostError(f"cannot price {op!r}: expected a torch OpOverload such as torch.ops.aten.sort.default")


def _tensors(args: Any, kwargs: Any) -> list[torch.Tensor]:
    from torch.utils._pytree import tree_leaves

    return [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]


def run_on_meta(op: OpOverload, args: Sequence[Any], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """Output tensors of ``op`` computed by its meta kernel (shapes only; raises CostError if it has none)."""
    from torch.utils._pytree import tree_leaves

    return [t for t in tree_leaves(meta_call(op, args, kwargs)) if isinstance(t, torch.Tensor)]


def meta_call(op: OpOverload, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """``op``'s output (as returned, e.g. a tuple) computed on meta copies of the tensor arguments.

    ``device`` arguments (``_to_copy(..., device=cpu)``, factories) are redirected to meta too,
    so nothing is allocated or copied.
    """
    from torch.utils._pytree import tree_map

    def to_meta(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return torch.empty_strided(tuple(x.shape), tuple(x.stride()), dtype=x.dtype, device="meta")
        if isinstance(x, torch.device):
            return torch.device("meta")
        return x

    margs, mkwargs = tree_map(to_meta, (tuple(args), dict(kwargs)))
    try:
        out = op(*margs, **mkwargs)
    except Exception as e:  # data-dependent output shapes, missing meta kernels
        raise CostError(f"cannot infer the output of {op} from shapes alone ({type(e).__name__}: {e})") from e
    return out


def with_note(cost: OpCost, note: str) -> OpCost:
    return replace(cost, note="; ".join(n for n in (cost.note, note) if n))

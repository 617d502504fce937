"""``OpCost`` and ``estimate``: what one op call costs in arithmetic and memory traffic.

Lookup order (first that applies wins):

1. the op's rule's ``Rule.cost`` formula (our rules name one from
   :mod:`dtensor_rules.costs.formulas`; users' ``register(op, flops=, bytes=)`` become one),
   found through :mod:`dtensor_rules.costs.rule_source` (costs never imports the registry);
2. torch's own flop formula (``torch.utils.flop_counter.flop_registry``: mm, addmm, bmm,
   baddbmm, convolution, attention, ...) with operand/output bytes;
3. generic families: views (free), factories, copies, pointwise ops (1 op per output
   element), reductions (1 op per input element);
4. ``fallback=True`` only: a memory-bound estimate (inputs read + outputs written,
   0 flops) marked ``exact=False, source="fallback"``; otherwise :class:`CostError`.

Formulas read only shapes, strides and dtypes, except where the cost depends on data
(``_grouped_mm`` group sizes, boolean-mask counts, ``bincount`` length): those use the
values when the tensor is concrete and a documented assumption (``exact=False``) on
fake/meta tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import torch
from torch._ops import OpOverload, OpOverloadPacket

from dtensor_rules.costs._util import CostError, first_float_dtype, fits, nbytes
from dtensor_rules.costs.rule_source import rule_for

__all__ = ["OpCost", "CostError", "Formula", "estimate", "estimate_call", "resolve_overload"]

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


def estimate(op: Any, *args: Any, **kwargs: Any) -> OpCost:
    """Cost of ``op(*args, **kwargs)``; raises :class:`CostError` if no formula applies.

    Tensors may be real, fake or meta; pass the *local* shapes to price one rank's shard.
    """
    return estimate_call(op, args, kwargs)


def estimate_call(op: Any, args: Sequence[Any], kwargs: dict[str, Any] | None = None, *, fallback: bool = False) -> OpCost:
    """:func:`estimate` with explicit args; ``fallback=True`` allows the memory-bound estimate."""
    kwargs = dict(kwargs or {})
    args = tuple(args)
    overload = resolve_overload(op, args, kwargs)

    rule = rule_for(overload)
    if rule is not None and rule.cost is not None:
        return rule.cost(overload, args, kwargs)

    from dtensor_rules.costs.formulas import generic_cost
    from dtensor_rules.costs.formulas.torch_flops import torch_flop_cost

    cost = torch_flop_cost(overload, args, kwargs)
    if cost is not None:
        return cost
    cost = generic_cost(overload, args, kwargs)
    if cost is not None:
        return cost
    if fallback:
        return _memory_fallback(overload, args, kwargs)
    raise CostError(
        f"no cost formula for {overload}: give its rule one with "
        f"dtensor_rules.register({overload}, cost=...) or (flops=..., bytes=...), or call "
        "estimate_call(op, args, kwargs, fallback=True) for a memory-bound estimate (inputs read + "
        "outputs written, 0 flops, marked exact=False)"
    )


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


def _memory_fallback(op: OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> OpCost:
    ins = _tensors(args, kwargs)
    outs = run_on_meta(op, args, kwargs)
    return OpCost(
        0,
        sum(nbytes(t) for t in ins),
        sum(nbytes(t) for t in outs),
        dtype=first_float_dtype(ins),
        exact=False,
        source="fallback",
        note=f"ESTIMATE: no formula for {op}; inputs read once + outputs written once, 0 flops",
    )


def with_note(cost: OpCost, note: str) -> OpCost:
    return replace(cost, note="; ".join(n for n in (cost.note, note) if n))

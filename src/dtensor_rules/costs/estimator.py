"""``estimate``: which formula prices one op call (``OpCost`` lives in :mod:`~dtensor_rules.costs.op_cost`).

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

from collections.abc import Sequence
from typing import Any

from torch._ops import OpOverload

from dtensor_rules.costs._util import CostError, first_float_dtype, nbytes
from dtensor_rules.costs.formulas import generic_cost
from dtensor_rules.costs.formulas.torch_flops import torch_flop_cost
from dtensor_rules.costs.op_cost import OpCost, _tensors, resolve_overload, run_on_meta
from dtensor_rules.costs.rule_source import rule_for

__all__ = ["estimate", "estimate_call"]


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

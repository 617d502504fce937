"""``OpCost`` and ``estimate``: what one op call costs in arithmetic and memory traffic.

Lookup order (first that applies wins):

1. a user rule's ``Rule.flops`` / ``Rule.bytes`` from :func:`dtensor_rules.registry.rules`
   (how users price their own custom ops);
2. our per-op table (:mod:`dtensor_rules.costs.formulas`), keyed by ``OpOverload``;
3. torch's own flop formula (``torch.utils.flop_counter.flop_registry``: mm, addmm, bmm,
   baddbmm, convolution, attention, ...) with operand/output bytes;
4. generic families: views (free), factories, copies, pointwise ops (1 op per output
   element), reductions (1 op per input element);
5. ``fallback=True`` only: a memory-bound estimate (inputs read + outputs written,
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

__all__ = ["OpCost", "CostError", "estimate", "estimate_call", "resolve_overload"]

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

    user = _from_user_rule(overload, args, kwargs)
    if user is not None:
        return user

    from dtensor_rules.costs.formulas import TABLE, generic_cost

    formula = TABLE.get(overload)
    if formula is not None:
        return formula(overload, args, kwargs)

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
        f"no cost formula for {overload}: register one with "
        f"dtensor_rules.register({overload}, flops=..., bytes=...)(rule), or call "
        "estimate_call(op, args, kwargs, fallback=True) for a memory-bound estimate (inputs read + "
        "outputs written, 0 flops, marked exact=False)"
    )


def table_backed(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a ``Rule.flops/bytes`` callable as a view of our table, so ``estimate`` uses the table's full OpCost."""
    fn.__dtensor_rules_table__ = True  # type: ignore[attr-defined]
    return fn


def _from_user_rule(op: OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> OpCost | None:
    from dtensor_rules.registry import rules

    rule = rules().get(op)
    if rule is None or (rule.flops is None and rule.bytes is None):
        return None
    fns = [f for f in (rule.flops, rule.bytes) if f is not None]
    if all(getattr(f, "__dtensor_rules_table__", False) for f in fns):
        return None
    notes = []
    flops = 0
    if rule.flops is not None:
        flops = int(rule.flops(*args, **kwargs))
    else:
        notes.append("rule gave no flops formula: 0 assumed")
    read = written = 0
    if rule.bytes is not None:
        b = rule.bytes(*args, **kwargs)
        if isinstance(b, OpCost):
            read, written = b.bytes_read, b.bytes_written
        elif isinstance(b, tuple) and len(b) == 2:
            read, written = int(b[0]), int(b[1])
        elif isinstance(b, int):
            read = int(b)
            notes.append("rule gave total bytes: counted as bytes_read")
        else:
            raise CostError(f"bytes formula of the rule for {op} returned {b!r}: expected int, (read, written) or OpCost")
    else:
        notes.append("rule gave no bytes formula: 0 assumed")
    if flops < 0 or read < 0 or written < 0:
        raise CostError(f"cost formula of the rule for {op} returned a negative cost")
    return OpCost(
        flops,
        read,
        written,
        dtype=first_float_dtype(_tensors(args, kwargs)),
        exact=not notes,
        source="rule",
        note="; ".join(notes),
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

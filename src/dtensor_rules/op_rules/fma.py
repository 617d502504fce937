"""``prims.fma(a, b, c) = a * b + c`` (inductor's fused multiply-add; softmax backward decomposes into it).

Strategies, per mesh dim ([out, a, b, c]); ``out`` has the promoted dtype of a, b, c:

=========================  ==============================  ===========================================
out                        a, b, c                         why it is valid
=========================  ==============================  ===========================================
S(d) for each out dim d    S(aligned dim), R if broadcast  pointwise: each rank computes its slice
P(sum)                     P(sum), R, P(sum)               sum_i(a_i*b + c_i) = a*b + c  (linear in a, c)
P(sum)                     R, P(sum), P(sum)               same, linear in (b, c)
P(avg)                     P(avg), R, P(avg) or R          the mean is affine: mean_i(a_i*b + c) = a*b + c
P(avg)                     R, P(avg), P(avg) or R          idem in b
P(avg)                     R, R, P(avg)                    mean_i(a*b + c_i) = a*b + c
P(max) / P(min)            R, R, P(max) / P(min)           a*b is identical on all ranks; adding it is monotone
R                          R, R, R                         implied
=========================  ==============================  ===========================================

Dtypes. A Partial operand must survive the cast to the output dtype
(:func:`~dtensor_rules.op_rules._partial.partial_survives_cast`): for sum/avg only when it already
has the output dtype (int8 parts promoted to int64 would not wrap the way their int8 sum does;
float16 parts promoted to float32 would not overflow the way their float16 sum does). avg needs a
floating output; max/min need a floating output (an integer ``a*b + c_i`` can wrap, which is not
monotone) and a monotone cast of ``c``; bool outputs get no Partial rows.

Not offered: a and b both Partial (bilinear), P(max) on a or b (sign of the other factor
flips the order), P(sum) with a replicated addend (it would be counted n times; the mean
does not have that problem, which is why P(avg) admits more layouts than P(sum)).

Registration is lazy: ``prims.fma`` only exists once ``torch._inductor.inductor_prims`` is
imported (~2 s), so the rule and its cost formula are registered (and installed, if our rules
are installed) when inductor defines the op, the way upstream registers its own fma rule: the
named patch ``deferred_fma`` (``dtensor_rules/deferred_rules.py``, docs/patches.md). ``status()`` lists the rule before that
(``status().deferred``); ``dtensor_rules.op_rules.fma.fma`` (the op) defines it on first access.

Dispatch prices at most two strategies built from these rows (:mod:`dtensor_rules.dispatch`);
solver and validator queries see every row over every mesh dim.

Cost (family ``pointwise``): 2 flops (multiply, add) per output element; reads each operand's
distinct memory once, writes the broadcast output in the promoted dtype.

Samples: uneven shapes, broadcasting, bf16.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._ops import OpOverload
from torch.distributed.tensor.placement_types import Partial, Replicate

from dtensor_rules._upstream import ensure_prims_fma
from dtensor_rules.costs._util import nbytes, numel
from dtensor_rules.costs.formulas import formula
from dtensor_rules.costs.op_cost import OpCost
from dtensor_rules.op_rules._common import broadcast_shape, generator, metas, PlacementOrHole, Samples, shard_through_broadcast
from dtensor_rules.op_rules._partial import partial_ops, partial_survives_cast


# --------------------------------------------------------------------------- cost formula

def _fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> OpCost:
    out_shape = broadcast_shape(a.shape, b.shape, c.shape)
    dtype = torch.promote_types(torch.promote_types(a.dtype, b.dtype), c.dtype)
    n = numel(out_shape)
    return OpCost(2 * n, nbytes(a) + nbytes(b) + nbytes(c), n * dtype.itemsize, dtype=dtype)


@formula(family="pointwise")
def fma_cost(op: OpOverload, b: dict[str, Any]) -> OpCost:
    return _fma(b["a"], b["b"], b["c"])


# --------------------------------------------------------------------------- sample suites

def fma_samples() -> Samples:
    g = generator(0)
    r = lambda *s, dtype=torch.float32: torch.randn(*s, generator=g).to(dtype)  # noqa: E731
    return [
        ((r(4, 6), r(4, 6), r(4, 6)), {}),
        ((r(5, 3), r(5, 3), r(3)), {}),  # broadcast addend, uneven dim 0
        ((r(4, 1), r(1, 6), r(4, 6)), {}),  # outer-product broadcasting
        ((r(3, 4, 5, dtype=torch.bfloat16), r(3, 4, 5, dtype=torch.bfloat16), r(5, dtype=torch.bfloat16)), {}),
    ]


def __getattr__(name: str) -> Any:
    """``fma``: the op ``torch.ops.prims.fma.default``, defined (inductor imported) on first access."""
    if name == "fma":
        return define_fma()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def fma_rows(a: Any, b: Any, c: Any) -> list[list[PlacementOrHole]]:
    """Every row of the table above valid for these operand metas (dtypes decide the Partial rows)."""
    out_shape = broadcast_shape(a.shape, b.shape, c.shape)
    out_dtype = torch.promote_types(torch.promote_types(a.dtype, b.dtype), c.dtype)
    rows = shard_through_broadcast(out_shape, [a.shape, b.shape, c.shape])
    R = Replicate()

    def ok(op: str, *operands: Any) -> bool:
        return op in partial_ops([out_dtype]) and all(partial_survives_cast(op, m.dtype, out_dtype) for m in operands)

    if ok("sum", a, c):
        rows.append([Partial("sum"), Partial("sum"), R, Partial("sum")])
    if ok("sum", b, c):
        rows.append([Partial("sum"), R, Partial("sum"), Partial("sum")])
    A = Partial("avg")
    if ok("avg", a, c):
        rows.append([A, A, R, A])
    if ok("avg", b, c):
        rows.append([A, R, A, A])
    if ok("avg", a):
        rows.append([A, A, R, R])
    if ok("avg", b):
        rows.append([A, R, A, R])
    if ok("avg", c):
        rows.append([A, R, R, A])
    for reduce_op in ("max", "min"):
        if out_dtype.is_floating_point and ok(reduce_op, c):
            rows.append([Partial(reduce_op), R, R, Partial(reduce_op)])
    return rows


def fma_strategy(op: Any, args: Any, kwargs: Any) -> list[list[PlacementOrHole]]:
    """Pointwise sharding through broadcasting plus the Partial strategies linearity allows."""
    return fma_rows(*metas(args))


def register_fma_rule() -> OpOverload:
    """The whole contract (strategy, cost, samples) of the op inductor defines; idempotent."""
    from dtensor_rules import registry

    op = torch.ops.prims.fma.default
    if op not in registry.rules():
        registry.register(op, cost=fma_cost, samples=fma_samples)(fma_strategy)
    return op


def define_fma() -> OpOverload:
    """Define ``prims.fma`` (imports inductor, ~2 s) and register its rule: what `validate --op fma` needs."""
    ensure_prims_fma()
    return register_fma_rule()

"""``aten.cumsum`` (and ``cumsum_``, ``cumsum.out``): inclusive prefix sum along ``dim``.

Strategies, per mesh dim ([out, self] (+ out= for ``.out``); ``cumsum_`` writes into self):

=====================  ===============  ============================================================
out                    self             why it is valid
=====================  ===============  ============================================================
S(d), d != dim         S(d)             each 1-D slice along ``dim`` is scanned on its own; ranks
                                        hold whole slices
P(sum)                 P(sum)           cumsum is linear: sum_i cumsum(x_i) = cumsum(sum_i x_i).
                                        Offered only when the result dtype equals the input dtype
                                        (``partial_survives_cast``; for integers that is exact
                                        modular arithmetic)
P(avg)                 P(avg)           linear maps commute with the mean; floating, same dtype
R                      R                implied
=====================  ===============  ============================================================

Not offered, and why (each is wrong for some input):

- ``dim`` sharded: later shards need the running total of earlier ones (a carry across ranks).
- P(max) / P(min): a prefix sum is not monotone in the max sense (cumsum([3, -5]) = [3, -2],
  cumsum([0, 0]) = [0, 0]: the max of the parts' cumsums is [3, 0], cumsum of their max is [3, -2]).
- Partial into a LESS precise float (``cumsum(x_fp32, dtype=float16)``): each part is cast
  on its own and may overflow where the sum does not (parts 70000 and -70000 become fp16 inf and
  -inf, reduced to NaN; single device gives 0), or round differently than the sum.
- Partial into a MORE precise float (``cumsum(x_fp32, dtype=float64)``, bf16 -> fp32): a Partial
  input's value is the reduction of its parts rounded to the input dtype; carrying the parts
  through gives the unrounded sum, off by one input-dtype rounding, which the wider result exposes.
- P(sum) when the result dtype differs from an integer input's (``int32 -> int64`` is the default
  promotion, or ``dtype=`` given): DTensor's int Partial sums wrap modulo 2**32 (or 2**8 ...), but
  cumsum in a wider type of each part does not, so the parts' sums differ from the true result
  whenever a part overflowed the narrow type; an int -> float cast is not additive under wraparound
  either, and a float -> int cast truncates (not additive: trunc(0.5) + trunc(0.5) != trunc(1.0)).

Upstream torch 2.13 offers only S(d) for ``cumsum.default`` (no Partial at all, so a P(sum) input
is all-gathered first) and has no rule for ``cumsum_`` / ``cumsum.out``.

Cost (``cumsum_cost``, family ``scan``): one add per element; writes in ``dtype``, else int64 for
integer/bool inputs (torch's promotion), else the input dtype. In-place ``cumsum_`` writes in the
input dtype.

Samples: Partial-carrying dtypes, int promotion, ``dtype=``, in place.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._ops import OpOverload
from torch.distributed.tensor.placement_types import Partial

from dtensor_rules._upstream import ShardingPlaceholder
from dtensor_rules.costs._util import nbytes, numel
from dtensor_rules.costs.formulas import formula
from dtensor_rules.costs.op_cost import OpCost
from dtensor_rules.op_rules._common import generator, normalize_dim, PlacementOrHole, Samples
from dtensor_rules.op_rules._gaps import ALIASED_UNPRICED
from dtensor_rules.op_rules._partial import partial_survives_cast
from dtensor_rules.op_rules._schema_args import row, schema_arg
from dtensor_rules.registry import register

aten = torch.ops.aten
CUMSUM = [aten.cumsum.default, aten.cumsum.out, aten.cumsum_.default]


# --------------------------------------------------------------------------- cost formula

@formula(family="scan")
def cumsum_cost(op: OpOverload, b: dict[str, Any]) -> OpCost:
    self, dtype = b["self"], b["dtype"]
    if op is aten.cumsum_.default:
        out_dtype = self.dtype
    elif dtype is not None:
        out_dtype = dtype
    elif self.dtype.is_floating_point or self.dtype.is_complex:
        out_dtype = self.dtype
    else:
        out_dtype = torch.int64
    n = numel(self)
    return OpCost(n, nbytes(self), n * out_dtype.itemsize, dtype=out_dtype)


# --------------------------------------------------------------------------- sample suites

def cumsum_samples() -> Samples:
    g = generator(10)
    counts = torch.randint(0, 9, (8,), generator=g)  # tokens per expert -> offsets
    return [
        ((torch.randn(5, 4, 3, generator=g), 1), {}),
        ((counts, 0), {}),  # int64 -> int64: P(sum) exact
        ((torch.randint(-5, 6, (3, 5), generator=g, dtype=torch.int32), 1), {}),  # int32 -> int64
        ((torch.randn(4, 6, generator=g).to(torch.bfloat16), -1), {}),
        ((torch.randn(6, 3, generator=g), 0), {"dtype": torch.float64}),  # wider result
        ((torch.randint(0, 4, (5, 3), generator=g), 0), {"dtype": torch.float32}),  # int -> float
        ((torch.randn(3, 5, generator=g).double(), 1), {"dtype": torch.float32}),  # narrower result
    ]


def cumsum_inplace_samples() -> Samples:
    g = generator(11)
    return [
        ((torch.randn(5, 3, generator=g), 0), {}),
        ((torch.randint(-3, 4, (4, 5), generator=g, dtype=torch.int32), 1), {}),  # int32 in place: exact
        ((torch.randn(4, 6, generator=g).to(torch.bfloat16), -1), {}),
    ]


def cumsum_result_dtype(op: Any, self_dtype: torch.dtype, dtype: torch.dtype | None, out_dtype: torch.dtype | None) -> torch.dtype:
    """The dtype the op's result is stored in (what a Partial output would be reduced in)."""
    if op is aten.cumsum_.default:
        return self_dtype  # the result is written back into self
    if out_dtype is not None:
        return out_dtype
    if dtype is not None:
        return dtype
    if self_dtype == torch.bool or not (self_dtype.is_floating_point or self_dtype.is_complex):
        return torch.int64  # integral inputs accumulate in int64
    return self_dtype


def linear_partials(in_dtype: torch.dtype, out_dtype: torch.dtype) -> list[str]:
    """The Partial reduce ops a linear map from ``in_dtype`` to ``out_dtype`` carries through:
    sum / avg where the cast between them is additive (only the identity, see ``partial_survives_cast``)."""
    return [op for op in ("sum", "avg") if partial_survives_cast(op, in_dtype, out_dtype)]


@register(aten.cumsum.default, cost=cumsum_cost, samples=cumsum_samples)
@register(aten.cumsum_.default, cost=cumsum_cost, samples=cumsum_inplace_samples)
@register(aten.cumsum.out, gaps=ALIASED_UNPRICED)
def cumsum_strategy(op: Any, args: Any, kwargs: Any) -> list[list[PlacementOrHole]]:
    """Shard any dim but ``dim``; Partial(sum/avg) passes through where the dtypes keep it linear."""
    self_meta = args[0]
    ndim = len(self_meta.shape)
    dim = normalize_dim(schema_arg(op, args, kwargs, "dim"), ndim)
    out_meta = kwargs.get("out")
    result = cumsum_result_dtype(
        op, self_meta.dtype, schema_arg(op, args, kwargs, "dtype"), out_meta.dtype if out_meta is not None else None
    )

    def r(p: PlacementOrHole) -> list[PlacementOrHole]:
        return row(op, args, kwargs, [p], {"self": p, "out": p})

    rows = [r(ShardingPlaceholder(d)) for d in range(ndim) if d != dim]
    rows += [r(Partial(reduce_op)) for reduce_op in linear_partials(self_meta.dtype, result)]
    return rows

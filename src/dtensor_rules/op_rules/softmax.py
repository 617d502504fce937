"""``aten._softmax_backward_data``: grad_input = y * (g - sum(g * y, dim, keepdim=True)).

Strategies, per mesh dim ([grad_input, grad_output g, output y] (+ grad_input= for .out)):

================================  ===========================  =========================================
grad_input                        g, y                         why it is valid
================================  ===========================  =========================================
S(d), d != softmax dim            S(d), S(d)                   rows along ``dim`` stay whole on each rank
P(sum)                            P(sum), R                    linear in g: sum_i y*(g_i - <g_i, y>) = result
P(avg)                            P(avg), R                    idem for the mean
R                                 R, R                         implied
================================  ===========================  =========================================

Upstream torch 2.13 has no Partial strategy (and no rule for ``.out``). Not offered: the softmax
dim sharded (the row sum needs the whole row), y Partial (the result is quadratic in y),
P(max)/P(min) (not linear-monotone).

Dtypes: the Partial rows need the result in g's own dtype (``input_dtype == g.dtype``): a kernel
that writes ``grad_input`` in another dtype (CUDA's half-to-float path) would round each rank's
part before the sum (:func:`~dtensor_rules.op_rules._partial.partial_survives_cast`).

Dispatch prices at most two strategies built from these rows (:mod:`dtensor_rules.dispatch`);
solver and validator queries see every row over every mesh dim.

Cost (family ``reduction``): ``y * (g - sum(g*y, dim))`` is 4 flops per element (product,
row-sum add, subtraction, product); reads g and y, writes grad_input in ``input_dtype``.

Samples: uneven shapes, bf16.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._ops import OpOverload
from torch.distributed.tensor.placement_types import Partial, Replicate

from dtensor_rules._upstream import ShardingPlaceholder
from dtensor_rules.costs._util import nbytes, numel
from dtensor_rules.costs.formulas import formula
from dtensor_rules.costs.op_cost import OpCost
from dtensor_rules.op_rules._common import generator, metas, normalize_dim, PlacementOrHole, Samples
from dtensor_rules.op_rules._gaps import ALIASED_SAMPLES
from dtensor_rules.op_rules._partial import partial_survives_cast
from dtensor_rules.registry import register

aten = torch.ops.aten
SOFTMAX_BACKWARD = [aten._softmax_backward_data.default, aten._softmax_backward_data.out]


# --------------------------------------------------------------------------- cost formula

def _softmax_backward(g: torch.Tensor, y: torch.Tensor, input_dtype: Any) -> OpCost:
    out_dtype = input_dtype if isinstance(input_dtype, torch.dtype) else g.dtype
    n = numel(g)
    return OpCost(4 * n, nbytes(g) + nbytes(y), n * out_dtype.itemsize, dtype=g.dtype)


@formula(family="reduction")
def softmax_backward_cost(op: OpOverload, b: dict[str, Any]) -> OpCost:
    return _softmax_backward(b["grad_output"], b["output"], b["input_dtype"])


# --------------------------------------------------------------------------- sample suites

def softmax_backward_samples() -> Samples:
    g = generator(1)
    out = []
    for shape, dim, dtype in (((4, 6), -1, torch.float32), ((5, 3, 4), 1, torch.float32), ((3, 8), 0, torch.bfloat16)):
        y = torch.randn(*shape, generator=g).softmax(dim).to(dtype)
        grad = torch.randn(*shape, generator=g).to(dtype)
        out.append(((grad, y, dim, dtype), {}))
    return out


@register(aten._softmax_backward_data.default, cost=softmax_backward_cost, samples=softmax_backward_samples)
@register(aten._softmax_backward_data.out, cost=softmax_backward_cost, gaps=ALIASED_SAMPLES)
def softmax_backward_strategy(op: Any, args: Any, kwargs: Any) -> list[list[PlacementOrHole]]:
    """Shard any non-softmax dim; Partial(sum/avg) grad passes through (linearity)."""
    g = metas(args)[0]
    ndim = len(g.shape)
    dim = normalize_dim(args[2], ndim)
    has_out = "grad_input" in kwargs

    def row(out: PlacementOrHole, g_p: PlacementOrHole, y_p: PlacementOrHole) -> list[PlacementOrHole]:
        return [out, g_p, y_p] + ([out] if has_out else [])

    strategies = [row(*(3 * [ShardingPlaceholder(d)])) for d in range(ndim) if d != dim]
    out_dtype = args[3] if isinstance(args[3], torch.dtype) else g.dtype
    for reduce_op in ("sum", "avg"):
        if partial_survives_cast(reduce_op, g.dtype, out_dtype):
            P = Partial(reduce_op)
            strategies.append(row(P, P, Replicate()))
    return strategies

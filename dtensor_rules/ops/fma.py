"""``prims.fma(a, b, c) = a * b + c`` (inductor's fused multiply-add; softmax backward decomposes into it).

Strategies, per mesh dim ([out, a, b, c]):

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

Not offered: a and b both Partial (bilinear), P(max) on a or b (sign of the other factor
flips the order), P(sum) with a replicated addend (it would be counted n times; the mean
does not have that problem, which is why P(avg) admits more layouts than P(sum)).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.tensor.placement_types import Partial, Replicate

from dtensor_rules._upstream import ensure_prims_fma
from dtensor_rules.costs.formulas.pointwise import fma_cost
from dtensor_rules.ops._common import PlacementOrHole, broadcast_shape, metas, shard_through_broadcast
from dtensor_rules.registry import register
from dtensor_rules.testing.suites.pointwise import fma_samples

ensure_prims_fma()  # defines torch.ops.prims.fma

fma = torch.ops.prims.fma.default


@register(fma, cost=fma_cost, samples=fma_samples)
def fma_strategy(op: Any, args: Any, kwargs: Any) -> list[list[PlacementOrHole]]:
    """Pointwise sharding through broadcasting plus the Partial strategies linearity allows."""
    a, b, c = metas(args)
    out_shape = broadcast_shape(a.shape, b.shape, c.shape)
    strategies: list[list[PlacementOrHole]] = shard_through_broadcast(out_shape, [a.shape, b.shape, c.shape])
    R = Replicate()
    S, A = Partial("sum"), Partial("avg")
    strategies += [[S, S, R, S], [S, R, S, S]]
    strategies += [[A, A, R, A], [A, R, A, A], [A, A, R, R], [A, R, A, R], [A, R, R, A]]
    for reduce_op in ("max", "min"):
        P = Partial(reduce_op)
        strategies.append([P, R, R, P])
    return strategies

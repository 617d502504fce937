"""``aten.sort`` / ``aten.argsort`` / ``aten.topk``: selection along one dim (values and indices).

Strategies, per mesh dim ([values, indices, self] (+ values=, indices= / out= for the out variants);
argsort has the single output ``indices``):

=====================  =====================  ==========================================================
values, indices        self                   why it is valid
=====================  =====================  ==========================================================
S(d), S(d), d != dim   S(d)                   each 1-D slice along ``dim`` is sorted / top-k'd on its own;
                                              sharding another dim hands every rank whole slices, and the
                                              indices are positions along ``dim``, which is not split, so
                                              they are already global
R, R                   R                      implied
=====================  =====================  ==========================================================

Not offered, and why (each is wrong for some input):

- ``dim`` sharded: a rank's local sort / top-k sees part of each slice (local top-k != global
  top-k, and local indices are offsets into the shard).
- any Partial input: sorting does not commute with sum / avg (sort(a) + sort(b) != sort(a + b))
  nor with elementwise max / min (sort of P(max) parts is not P(max) of the sorted result:
  [3, 0] and [0, 2] have max [3, 2] whose sort is [2, 3], but the max of the sorted parts
  [0, 3] and [0, 2] is [0, 3]); the indices would be meaningless.
- k has no effect on validity: ``dim`` is whole on every rank, so ``k <= size(dim)`` holds locally
  iff it holds globally (the local op raises the same error as single-device torch otherwise).

Ties: all strategies above hand each rank whole slices, so a rank runs exactly the single-device
computation on each slice; which of several equal elements comes first depends only on the slice.
``topk(sorted=False)`` returns an implementation-defined order; it is still a per-slice function.

``argsort`` is CompositeImplicitAutograd: with autograd on, DTensor sees the ``sort`` it
decomposes into; under ``torch.inference_mode()`` DTensor receives ``argsort`` itself and uses
this rule (upstream has none and falls back to decomposing).
Upstream torch 2.13 reads ``dim`` only positionally (``topk(x, k, dim=0)`` passed by keyword is
treated as ``dim=-1``, so it offers S(0) for a top-k along dim 0: a wrong result) and has no rule
for the out variants or argsort.
"""

from __future__ import annotations

from typing import Any

import torch
from dtensor_rules._upstream import ShardingPlaceholder

from dtensor_rules.core.suite_ref import suite
from dtensor_rules.costs.formulas.sorting import sort_cost, topk_cost
from dtensor_rules.ops._common import PlacementOrHole, normalize_dim
from dtensor_rules.ops._gaps import ALIASED_UNPRICED
from dtensor_rules.ops._schema_args import row, schema_arg
from dtensor_rules.registry import register

aten = torch.ops.aten
SORT = [aten.sort.default, aten.sort.stable, aten.sort.values, aten.sort.values_stable]
ARGSORT = [aten.argsort.default, aten.argsort.stable, aten.argsort.stable_out]
TOPK = [aten.topk.default, aten.topk.values]

_OUT_NAMES = ("values", "indices", "out")


def _n_outputs(op: Any) -> int:
    return sum(1 for r in op._schema.returns if "Tensor" in str(r.type))


def shard_other_dims(op: Any, args: Any, kwargs: Any) -> list[list[PlacementOrHole]]:
    """S(d) on self and every output for each d != the op's ``dim``; everything else replicated."""
    ndim = len(args[0].shape)
    dim = normalize_dim(schema_arg(op, args, kwargs, "dim"), ndim)
    n_out = _n_outputs(op)
    rows: list[list[PlacementOrHole]] = []
    for d in range(ndim):
        if d == dim:
            continue
        s = ShardingPlaceholder(d)
        rows.append(row(op, args, kwargs, [s] * n_out, {"self": s, **{n: s for n in _OUT_NAMES}}))
    return rows


@register(aten.sort.default, cost=sort_cost, samples=suite("sorting", "sort_samples"))
@register(aten.sort.stable, cost=sort_cost, samples=suite("sorting", "sort_stable_samples"))
@register([aten.sort.values, aten.sort.values_stable], gaps=ALIASED_UNPRICED)
def sort_strategy(op: Any, args: Any, kwargs: Any) -> list[list[PlacementOrHole]]:
    """sort(self, dim, descending[, stable]): shard any dim but ``dim``; no Partial."""
    return shard_other_dims(op, args, kwargs)


@register(aten.argsort.default, cost=sort_cost, samples=suite("sorting", "argsort_samples"))
@register(aten.argsort.stable, cost=sort_cost, samples=suite("sorting", "argsort_stable_samples"))
@register(aten.argsort.stable_out, gaps=ALIASED_UNPRICED)
def argsort_strategy(op: Any, args: Any, kwargs: Any) -> list[list[PlacementOrHole]]:
    """argsort = sort's indices: shard any dim but ``dim``; no Partial."""
    return shard_other_dims(op, args, kwargs)


@register(aten.topk.default, cost=topk_cost, samples=suite("sorting", "topk_samples"))
@register(aten.topk.values, gaps=ALIASED_UNPRICED)
def topk_strategy(op: Any, args: Any, kwargs: Any) -> list[list[PlacementOrHole]]:
    """topk(self, k, dim, largest, sorted): shard any dim but ``dim``; no Partial."""
    return shard_other_dims(op, args, kwargs)

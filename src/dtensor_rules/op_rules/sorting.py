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

Cost (comparisons counted as ops), per row of length ``n`` along ``dim`` (``rows = numel / n``):

- ``sort`` / ``argsort`` (all overloads, stable or not): ``n * ceil(log2 n)`` comparisons
  (comparison-sort bound; radix sorts on GPU do a similar count of passes x elements).
  Reads the input once, writes values and int64 indices (``argsort`` computes the
  values too: it is ``sort`` keeping the indices).
- ``topk(k)``: ``n`` comparisons to select, plus ``k * ceil(log2 k)`` to order the
  result when ``sorted=True``. Reads the input, writes ``k`` values and int64 indices per row.

Samples: uneven shapes, ties, int64, bf16, dim by keyword.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch._ops import OpOverload

from dtensor_rules._upstream import ShardingPlaceholder
from dtensor_rules.costs._util import dim_size, nbytes, numel
from dtensor_rules.costs.formulas import formula
from dtensor_rules.costs.op_cost import OpCost
from dtensor_rules.op_rules._common import generator, normalize_dim, PlacementOrHole, Samples
from dtensor_rules.op_rules._gaps import ALIASED_UNPRICED
from dtensor_rules.op_rules._schema_args import row, schema_arg
from dtensor_rules.registry import register

aten = torch.ops.aten
SORT = [aten.sort.default, aten.sort.stable, aten.sort.values, aten.sort.values_stable]
ARGSORT = [aten.argsort.default, aten.argsort.stable, aten.argsort.stable_out]
TOPK = [aten.topk.default, aten.topk.values]

_OUT_NAMES = ("values", "indices", "out")


# --------------------------------------------------------------------------- cost formula

INDEX_BYTES = torch.int64.itemsize


def _log2(n: int) -> int:
    return math.ceil(math.log2(n)) if n > 1 else 0


@formula(family="sort")
def sort_cost(op: OpOverload, b: dict[str, Any]) -> OpCost:
    self = b["self"]
    total = numel(self)
    n = dim_size(self, b["dim"])
    rows = total // n if n else 0
    flops = rows * n * _log2(n)
    return OpCost(flops, nbytes(self), total * (self.dtype.itemsize + INDEX_BYTES), dtype=self.dtype)


@formula(family="sort")
def topk_cost(op: OpOverload, b: dict[str, Any]) -> OpCost:
    self, k = b["self"], int(b["k"])
    n = dim_size(self, b["dim"])
    rows = numel(self) // n if n else 0
    flops = rows * (n + (k * _log2(k) if b["sorted"] else 0))
    return OpCost(flops, nbytes(self), rows * k * (self.dtype.itemsize + INDEX_BYTES), dtype=self.dtype)


# --------------------------------------------------------------------------- sample suites

def _inputs(seed: int) -> dict[str, torch.Tensor]:
    g = generator(seed)
    return {
        "f32": torch.randn(5, 4, 3, generator=g),
        "ties": torch.randint(0, 3, (6, 5), generator=g).float(),  # many equal values per row
        "i64": torch.randint(-4, 5, (3, 7), generator=g),
        "bf16": torch.randn(4, 6, generator=g).to(torch.bfloat16),
        "router": torch.randn(7, 8, generator=g).softmax(-1),  # tokens x experts scores
    }


def sort_samples() -> Samples:
    x = _inputs(0)
    return [
        ((x["f32"], 1), {}),
        ((x["f32"],), {}),  # default dim=-1
        ((x["ties"], 0, True), {}),
        ((x["i64"], -1), {}),
        ((x["bf16"],), {"dim": 0}),  # dim by keyword
    ]


def sort_stable_samples() -> Samples:
    x = _inputs(1)
    return [
        ((x["ties"],), {"stable": True, "dim": 1}),
        ((x["ties"],), {"stable": True, "dim": 0, "descending": True}),
        ((x["f32"],), {"stable": True}),
        ((x["i64"],), {"stable": True, "dim": 0}),
    ]


def argsort_samples() -> Samples:
    x = _inputs(2)
    return [((x["router"], 0), {}), ((x["i64"],), {"descending": True}), ((x["f32"], 1), {})]


def argsort_stable_samples() -> Samples:
    x = _inputs(3)
    return [
        ((x["ties"],), {"stable": True, "dim": 0}),  # MoE token permutation: argsort of expert ids
        ((x["i64"].flatten(),), {"stable": True}),
        ((x["bf16"],), {"stable": True, "dim": 1, "descending": True}),
    ]


def topk_samples() -> Samples:
    x = _inputs(4)
    return [
        ((x["router"], 2), {}),  # top-2 experts per token
        ((x["router"], 3, 0), {}),
        ((x["f32"], 2), {"dim": 0}),  # dim by keyword: upstream reads dim=-1 here
        ((x["i64"], 2, 1, False), {}),  # smallest
        ((x["bf16"], 1, -1, True, False), {}),  # sorted=False
    ]


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


@register(aten.sort.default, cost=sort_cost, samples=sort_samples)
@register(aten.sort.stable, cost=sort_cost, samples=sort_stable_samples)
@register([aten.sort.values, aten.sort.values_stable], gaps=ALIASED_UNPRICED)
def sort_strategy(op: Any, args: Any, kwargs: Any) -> list[list[PlacementOrHole]]:
    """sort(self, dim, descending[, stable]): shard any dim but ``dim``; no Partial."""
    return shard_other_dims(op, args, kwargs)


@register(aten.argsort.default, cost=sort_cost, samples=argsort_samples)
@register(aten.argsort.stable, cost=sort_cost, samples=argsort_stable_samples)
@register(aten.argsort.stable_out, gaps=ALIASED_UNPRICED)
def argsort_strategy(op: Any, args: Any, kwargs: Any) -> list[list[PlacementOrHole]]:
    """argsort = sort's indices: shard any dim but ``dim``; no Partial."""
    return shard_other_dims(op, args, kwargs)


@register(aten.topk.default, cost=topk_cost, samples=topk_samples)
@register(aten.topk.values, gaps=ALIASED_UNPRICED)
def topk_strategy(op: Any, args: Any, kwargs: Any) -> list[list[PlacementOrHole]]:
    """topk(self, k, dim, largest, sorted): shard any dim but ``dim``; no Partial."""
    return shard_other_dims(op, args, kwargs)

"""``aten.histc`` and ``aten.bincount``: counting ops (tokens per expert in an MoE router).

histc(self, bins, min, max) -- per mesh dim ([out, self] (+ out= for ``.out``)):

=====================  ===============  ============================================================
out                    self             why it is valid
=====================  ===============  ============================================================
P(sum)                 S(d), any d      a histogram with FIXED bin edges is a sum over elements of
                                        one-hot bin indicators, so it splits over any partition of
                                        the elements: sum_i histc(x_i) = histc(x). Offered only when
                                        ``min != max`` and numel(self) <= the dtype's exact integer
                                        range (2**8 bf16, 2**11 fp16, 2**24 fp32, 2**53 fp64)
R                      R                implied
=====================  ===============  ============================================================

- a symbolic element count (torch.compile with unbacked sizes) is not known to be within the
  exact range: only R (no guard on data).
- ``min == max`` (the default 0, 0 included) means "use the data's own min and max": each rank
  would bin its shard with its own range, so only R is valid.
- counts beyond the dtype's exact integer range are rounded, and single-device torch rounds them
  differently (bf16 histc of 1000 equal values gives 512); below it every count, per rank and
  summed, is an exact integer, so the sharded result equals single-device bit for bit.
- no Partial input: bin membership is not linear in the values. (The validator finds
  P(max)/P(min) self -> P(sum) valid on the suites only because its non-owner ranks hold values
  shifted out of [min, max]; if two ranks hold the true in-range value it is counted twice.)

bincount(self, weights=None, minlength=0) -- per mesh dim ([out, self, weights] (+ out=)):

=====================  ===============  ============================================================
out                    self, weights    why it is valid
=====================  ===============  ============================================================
P(sum)                 R, P(sum)        linear in weights: out[b] = sum_j w_j [self_j == b], and
                                        the length max(max(self) + 1, minlength) depends on self
                                        only, which every rank holds whole. float32 / float64
                                        weights only (see below)
P(avg)                 R, P(avg)        idem for the mean
R                      R, R             implied
=====================  ===============  ============================================================

- self sharded (with or without weights): every rank's output has length
  max(max(local self) + 1, minlength), which differs between ranks unless ``minlength`` exceeds
  the data's max: a property of the data, not of the arguments, so it cannot be offered.
- other weight dtypes are counted in float64. Integer weights: a wrapped-around int Partial does
  not cast additively. bf16 / fp16 weights: a Partial's value is the sum of its parts ROUNDED to
  bf16; carrying the parts into float64 gives the unrounded sum, off by a bf16 rounding that the
  float64 result exposes (the same reason cumsum keeps no Partial into a wider float).
- an empty ``self`` returns int64 zeros whatever the weights: no Partial (a float -> int map).
- Upstream torch 2.13 has no bincount rule, and DTensor dispatch of bincount fails before any
  rule is consulted: its output shape is data-dependent and DTensor computes output metadata
  with fake tensors (``DynamicOutputShapeException``). We therefore also install a custom
  dispatch handler (``dispatch/custom_handler.py``) that picks the cheapest strategy of THIS rule,
  redistributes to it and runs bincount locally; it is sound because no strategy shards the
  output (self is replicated, so every rank's result has the same, global, length).

Cost:

- ``histc(self, bins, min, max)`` (family ``histogram``: binning arithmetic per element): 5 ops per
  element (2 range compares, subtract and scale to a bin, 1 count increment); when ``min == max``
  the range is first found from the data (2 more compares per element and a second read of the
  input). Writes ``bins`` elements.
- ``bincount(self, weights, minlength)`` (family ``scatter``: ``counts[x[i]] += 1`` is an indexed
  read-modify-write, the access pattern of scatter_add): 2 ops per element (max scan,
  increment/add); reads the input twice (max pass, count pass) and the weights once; writes
  ``max(max(self) + 1, minlength)`` counts of int64 (no weights), float32 (float32 weights) or
  float64 (other weights). The length needs the data: on fake/meta inputs it is assumed to be
  ``max(minlength, 1)`` (``exact=False``).

Samples: tokens per expert, fixed and data-derived ranges.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._ops import OpOverload
from torch.distributed.tensor.placement_types import Partial, Replicate
from torch.fx.experimental.symbolic_shapes import statically_known_true

from dtensor_rules._upstream import ShardingPlaceholder
from dtensor_rules.costs._util import is_concrete, nbytes, numel
from dtensor_rules.costs.formulas import formula
from dtensor_rules.costs.op_cost import OpCost
from dtensor_rules.dispatch.custom_handler import rule_dispatch
from dtensor_rules.op_rules._common import generator, PlacementOrHole, Samples, sym_numel
from dtensor_rules.op_rules._gaps import ALIASED_UNPRICED
from dtensor_rules.op_rules._schema_args import row, schema_arg
from dtensor_rules.op_rules.scan import linear_partials
from dtensor_rules.registry import register

aten = torch.ops.aten
HISTC = [aten.histc.default, aten.histc.out]
BINCOUNT = [aten.bincount.default, aten.bincount.out]


# --------------------------------------------------------------------------- cost formula

@formula(family="histogram")
def histc_cost(op: OpOverload, b: dict[str, Any]) -> OpCost:
    self, bins = b["self"], int(b["bins"])
    n = numel(self)
    find_range = float(b["min"]) == float(b["max"])
    flops = n * (5 + (2 if find_range else 0))
    read = nbytes(self) * (2 if find_range else 1)
    return OpCost(flops, read, bins * self.dtype.itemsize, dtype=self.dtype)


@formula(family="scatter")
def bincount_cost(op: OpOverload, b: dict[str, Any]) -> OpCost:
    self, weights, minlength = b["self"], b["weights"], int(b["minlength"])
    n = numel(self)
    if weights is None:
        out_dtype = torch.int64
    else:
        out_dtype = torch.float32 if weights.dtype == torch.float32 else torch.float64
    exact = True
    if is_concrete(self):
        length = max(int(self.max()) + 1 if n else 0, minlength)
    else:
        length, exact = max(minlength, 1), False
    read = 2 * nbytes(self) + (nbytes(weights) if weights is not None else 0)
    note = "" if exact else "bincount length unknown (fake/meta): max(minlength, 1) assumed"
    return OpCost(2 * n, read, length * out_dtype.itemsize, dtype=out_dtype, exact=exact, note=note)


# --------------------------------------------------------------------------- sample suites

def histc_samples() -> Samples:
    g = generator(20)
    expert_ids = torch.randint(0, 8, (7, 2), generator=g).float()  # top-2 expert ids per token
    return [
        ((expert_ids, 8, 0, 7), {}),  # MoE tokens-per-expert
        ((torch.randn(5, 4, generator=g), 6, -1.5, 1.5), {}),  # values outside the range too
        ((torch.randn(3, 5, generator=g).to(torch.bfloat16), 4, -1, 1), {}),
        ((torch.randn(6, generator=g), 5, 2, 2), {}),  # min == max != 0: data range, upstream wrong
        ((torch.randn(4, 3, generator=g), 5), {}),  # defaults: data range
        ((torch.randn(5, 3, generator=g),), {"bins": 3, "min": -1, "max": 1}),  # by keyword
    ]


def bincount_samples() -> Samples:
    g = generator(21)
    ids = torch.randint(0, 6, (9,), generator=g)
    return [
        ((ids,), {}),
        ((ids, torch.rand(9, generator=g)), {}),  # gate-weighted counts
        ((ids, torch.randn(9, generator=g).to(torch.bfloat16), 8), {}),  # float64 result, minlength
        ((ids,), {"weights": torch.randn(9, generator=g).double(), "minlength": 3}),
        ((ids, torch.randint(0, 4, (9,), generator=g)), {}),  # int weights -> float64
    ]


def exact_count_limit(dtype: torch.dtype) -> int:
    """Largest n such that every integer in [0, n] is exactly representable in ``dtype``."""
    if not dtype.is_floating_point:
        return 0
    return round(2 / torch.finfo(dtype).eps)  # 2 ** (mantissa bits + 1)


def _scalar(x: Any) -> float | None:
    """A bin edge as a float; None if symbolic (then only R is offered: no guard on data)."""
    x = x.item() if hasattr(x, "item") else x
    return float(x) if isinstance(x, (int, float)) else None


@register(aten.histc.default, cost=histc_cost, samples=histc_samples)
@register(aten.histc.out, gaps=ALIASED_UNPRICED)
def histc_strategy(op: Any, args: Any, kwargs: Any) -> list[list[PlacementOrHole]]:
    """Fixed bin edges (min != max): any input dim sharded -> P(sum) counts; else replicate only."""
    self_meta = args[0]
    lo, hi = _scalar(schema_arg(op, args, kwargs, "min")), _scalar(schema_arg(op, args, kwargs, "max"))
    if lo is None or hi is None or lo == hi:
        return []
    if not statically_known_true(sym_numel(self_meta.shape) <= exact_count_limit(self_meta.dtype)):
        return []  # counts may exceed the exact range (or the size is symbolic): replicate
    total = Partial("sum")
    return [
        row(op, args, kwargs, [total], {"self": ShardingPlaceholder(d), "out": total})
        for d in range(len(self_meta.shape))
    ]


def bincount_dtype(weights_dtype: torch.dtype, self_numel: Any) -> torch.dtype:
    """bincount counts float32 / float64 weights in their own dtype, every other dtype in float64;
    an empty ``self`` gives int64 zeros whatever the weights (a torch quirk)."""
    if statically_known_true(self_numel == 0):
        return torch.int64  # (an unknown size that turns out 0 gives int64 zeros: a Partial of zeros is still exact)
    return weights_dtype if weights_dtype in (torch.float32, torch.float64) else torch.float64


@register(aten.bincount.default, cost=bincount_cost, samples=bincount_samples, handler=rule_dispatch)
@register(aten.bincount.out, gaps=ALIASED_UNPRICED, handler=rule_dispatch)
def bincount_strategy(op: Any, args: Any, kwargs: Any) -> list[list[PlacementOrHole]]:
    """Replicated self; Partial(sum/avg) floating weights give a Partial(sum/avg) histogram."""
    weights = schema_arg(op, args, kwargs, "weights")
    if weights is None:
        return []
    rows = []
    for reduce_op in linear_partials(weights.dtype, bincount_dtype(weights.dtype, sym_numel(args[0].shape))):
        p = Partial(reduce_op)
        rows.append(row(op, args, kwargs, [p], {"self": Replicate(), "weights": p, "out": p}))
    return rows

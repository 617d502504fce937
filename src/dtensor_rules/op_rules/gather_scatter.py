"""``aten.gather``, ``aten.scatter_add``, ``aten.scatter`` (src/value) and ``aten.scatter_reduce.two``.

Notation: ``dim`` is the indexed dim; an element at position p of ``index`` reads (gather) or
writes (scatter) the element of self at p with coordinate ``dim`` replaced by ``index[p]``. On
every other dim d the coordinate is taken *as is*, which is why sharding d is only valid when
all operands have the same size on d (their chunks then start at the same global offsets);
index may be smaller than self/src on any dim, and then sharding that dim is NOT offered.

gather(self, dim, index) — ``[out, self, index]`` (+ ``out=``):

=======================  =====================  ==========================================================
out                      self, index            why it is valid
=======================  =====================  ==========================================================
S(d), d != dim           S(d), S(d)             only if self.size(d) == index.size(d): chunks line up
S(dim)                   R, S(dim)              out has index's shape; each rank looks up its index rows in
                                                the whole self (out rows along dim follow index rows)
M                        S(dim), M              M = IndexMaskPartial: each rank looks up the indices in its
                                                chunk of self and zeroes the rest, so the lookups are
                                                disjoint and sum to out (upstream's masked partial, with
                                                the mask made at dispatch: op_rules/gather_mask.py); only if
                                                index.size(dim) == 1 or 2 * index.numel() <= self.numel()
                                                (reducing out later moves no more than all-gathering self);
                                                not for ``out=`` nor bool (no sum), nor where dispatch
                                                cannot make the mask (``install(ops=...)`` without the
                                                cache-miss hook); self sharded on dim on several mesh dims
                                                nests the chunks
P(op), op in sum/avg/    P(op), R               linear in self; each output is a copy of one self element,
max/min                                         so max/min commute with it
R                        R, R                   implied
=======================  =====================  ==========================================================

scatter_add(self, dim, index, src) — ``[out, self, index, src]`` (also ``scatter_add_``, ``.out``):

=======================  =====================  ==========================================================
out                      self, index, src       why it is valid
=======================  =====================  ==========================================================
S(d), d != dim           S(d), S(d), S(d)       only if self, index and src have equal size on d
P(sum)                   P(sum), R, P(sum)      linear in (self, src) jointly
P(sum)                   P(sum), S(dim), S(dim) only if index.size(dim) == src.size(dim): each rank adds
                                                its rows of src into its part of self; summing the parts
                                                adds every src row exactly once (the MoE combine pattern)
P(avg)                   P(avg)|R, R, P(avg)|R  affine: the mean of a replicated operand is itself
                         (not both R)
P(max) / P(min)          P(op), R, R            out = self + c with c identical on all ranks: monotone
R                        R, R, R                implied
=======================  =====================  ==========================================================

scatter.src(self, dim, index, src) — like scatter_add's S(d) rows, plus P(sum) (P, R, P) and
for avg/max/min self and src each R or P(op), not both R (every output element is a copy
of one element of self or src). scatter.value(self, dim, index, value): S(d) rows, and
P(avg/max/min) self with index R (a written scalar is the same on all ranks; P(sum) only
when the scalar is 0, otherwise it would be summed n times).

scatter_reduce.two(self, dim, index, src, reduce, include_self): S(d) rows for every reduce, and

=====================  ========================================================  ==============================
reduce, include_self   Partial rows ``[out, self, index, src]``                  why
=====================  ========================================================  ==============================
any, False             P(op), P(op), R, R for op in avg/max/min                  written positions get a value
                                                                                 identical on all ranks
sum, True              P(op), P(op), R, R for op in avg/max/min                  self + c: affine, monotone
mean, True             same (avg only for floating dtypes)                       (self + c)/(k+1): affine,
                                                                                 monotone
amax/amin, True        P(max) and P(min), self P, R, R                           max(self, c) is monotone
prod, True             P(sum) and P(avg), self P, R, R                           self * c is linear
sum; mean (floats)     P(sum): P, R, P;  P(avg): P(avg)|R, R, P(avg)             jointly linear in (self, src)
amax / amin            P(max)/P(min): P(op)|R, R, P(op)                          a max of maxes
sum, True              P(sum), P(sum), S(dim), S(dim)                            each rank folds its rows of
amax/amin, True        P(op), P(op)|R, S(dim), S(dim)                            src into its self part; the
                       (only if index.size(dim) == src.size(dim))                fold is associative
=====================  ========================================================  ==============================

Symbolic sizes (torch.compile): "equal size on d" and "index.size(dim) == src.size(dim)" must be
statically known (``size_is``); an unknown (unbacked) size drops those rows, never guards.
Integer self with index-sharded rows: a replicated self reaches P(sum) through the exact integer
partition (value on coordinate 0, zeros elsewhere; ``op_rules/_partial.py``), not upstream's v / n.

Not offered anywhere else: the indexed dim of self sharded (index values are global
coordinates; gather masks them instead), index Partial (indices are not additive), sharding d
with unequal sizes. Upstream torch 2.13 has no Partial strategy for any of these, its masked
gather only for ``index.size(dim) == 1`` (and failing where its mask buffer is reused, see
``_upstream/mask.py``), and its scatter_add checks only self vs index sizes (src larger than
index on d is sharded wrongly).

Cost (memory-bound, priced by the elements touched; ``k`` = ``index.numel()``, ``isz`` = element
size of self; "index" and "src" count the tensor's distinct bytes, stride-0 dims once):

=================================  ==========================================  =========================  =================
op                                 bytes read                                  bytes written              flops
=================================  ==========================================  =========================  =================
gather(self, dim, index)           index + k * isz                             k * isz                    0
scatter(self, dim, index, src)     self (copy) + index + k * src isz           self (copy) + k * isz      0
scatter.value                      self (copy) + index                         self (copy) + k * isz      0
scatter_add / scatter_reduce       as scatter + k * isz (read-modify-write)    as scatter                 k (mean: + self)
in-place variants (``..._``)       as above without the copy of self           k * isz                    as above
=================================  ==========================================  =========================  =================

Families (``OpCost.family``, for per-family hardware efficiency): ``gather``, ``scatter``.

Samples: index smaller than self and src on non-indexed dims, duplicate indices, negative dims,
bf16 and int64.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._ops import OpOverload
from torch.distributed.tensor.placement_types import Partial, Placement, Replicate

from dtensor_rules._upstream import ShardingPlaceholder
from dtensor_rules.costs._util import nbytes, numel
from dtensor_rules.costs.formulas import formula
from dtensor_rules.costs.op_cost import OpCost
from dtensor_rules.op_rules._common import generator, metas, normalize_dim, PlacementOrHole, Samples, size_is
from dtensor_rules.op_rules._gaps import ALIASED_SAMPLES, ALIASED_UNPRICED
from dtensor_rules.op_rules._partial import partial_ops
from dtensor_rules.op_rules.gather_mask import mask_row, mask_row_offered, mask_row_pays
from dtensor_rules.registry import register

aten = torch.ops.aten
GATHER = [aten.gather.default, aten.gather.out]
SCATTER_ADD = [aten.scatter_add.default, aten.scatter_add_.default, aten.scatter_add.out]
SCATTER_SRC = [aten.scatter.src, aten.scatter_.src, aten.scatter.src_out]
SCATTER_VALUE = [aten.scatter.value, aten.scatter_.value, aten.scatter.value_out]
SCATTER_REDUCE = [aten.scatter_reduce.two, aten.scatter_reduce_.two, aten.scatter_reduce.two_out]

Row = list[PlacementOrHole]
R: Placement = Replicate()


# --------------------------------------------------------------------------- cost formula

@formula(family="gather")
def gather_cost(op: OpOverload, b: dict[str, Any]) -> OpCost:
    self, index = b["self"], b["index"]
    k, isz = numel(index), self.dtype.itemsize
    return OpCost(0, nbytes(index) + k * isz, k * isz, dtype=self.dtype)


_SCATTER_OUT = (aten.scatter.src, aten.scatter.value, aten.scatter_add.default, aten.scatter_reduce.two)


_SCATTER_INPLACE = (aten.scatter_.src, aten.scatter_.value, aten.scatter_add_.default, aten.scatter_reduce_.two)


@formula(family="scatter")
def scatter_cost(op: OpOverload, b: dict[str, Any]) -> OpCost:
    self, index = b["self"], b["index"]
    src = b.get("src")
    k, isz = numel(index), self.dtype.itemsize
    name = op._schema.name.split("::")[1].rstrip("_")
    reduces = name in ("scatter_add", "scatter_reduce")
    read = nbytes(index) + (k * src.dtype.itemsize if isinstance(src, torch.Tensor) else 0)
    written = k * isz
    flops = 0
    if reduces:
        read += k * isz
        flops = k
        if b.get("reduce") == "mean":
            flops += numel(self)  # the final division by the counts
    if op in _SCATTER_OUT:
        read += nbytes(self)
        written += numel(self) * isz
    return OpCost(flops, read, written, dtype=self.dtype)


# --------------------------------------------------------------------------- sample suites

def _index(g: torch.Generator, high: int, *shape: int) -> torch.Tensor:
    return torch.randint(0, high, shape, generator=g)


def _r(g: torch.Generator, *shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.randn(*shape, generator=g).to(dtype)
    return torch.randint(-5, 6, shape, generator=g, dtype=dtype)


def gather_samples() -> Samples:
    g = generator(20)
    return [
        ((_r(g, 4, 6), 1, _index(g, 6, 4, 3)), {}),  # same size on the other dim
        ((_r(g, 5, 6), 1, _index(g, 6, 3, 3)), {}),  # index smaller on dim 0
        ((_r(g, 5, 4), -2, _index(g, 5, 7, 4)), {}),  # index longer on the gathered dim (duplicates)
        ((_r(g, 3, 5, dtype=torch.bfloat16), 1, _index(g, 5, 3, 5)), {}),
        ((_r(g, 4, 5, dtype=torch.int64), 0, _index(g, 4, 2, 5)), {}),
    ]


def scatter_add_samples() -> Samples:
    g = generator(21)
    return [
        ((_r(g, 4, 6), 0, _index(g, 4, 5, 6), _r(g, 5, 6)), {}),  # duplicates along dim 0
        ((_r(g, 4, 6), 1, _index(g, 6, 4, 3), _r(g, 6, 5)), {}),  # src larger than index
        ((_r(g, 5, 3), -2, _index(g, 5, 6, 2), _r(g, 6, 3)), {}),  # index narrower than self on dim 1
        ((_r(g, 6, 4, dtype=torch.bfloat16), 0, _index(g, 6, 3, 4), _r(g, 3, 4, dtype=torch.bfloat16)), {}),
        ((_r(g, 4, 3, dtype=torch.int64), 1, _index(g, 3, 4, 3), _r(g, 4, 3, dtype=torch.int64)), {}),
    ]


def scatter_src_samples() -> Samples:
    g = generator(22)
    # unique indices along dim so the written value is well defined
    idx = torch.stack([torch.randperm(6, generator=g)[:3] for _ in range(4)])
    return [
        ((_r(g, 4, 6), 1, idx, _r(g, 4, 3)), {}),
        ((_r(g, 4, 6), 1, idx[:, :2], _r(g, 5, 4)), {}),  # src larger than index
        ((_r(g, 5, 4, dtype=torch.int64), 0, torch.randperm(5, generator=g)[:3].view(3, 1).expand(3, 4).contiguous(), _r(g, 3, 4, dtype=torch.int64)), {}),
    ]


def scatter_value_samples() -> Samples:
    g = generator(23)
    return [
        ((_r(g, 4, 6), 1, _index(g, 6, 4, 3), 0.0), {}),
        ((_r(g, 5, 3), 0, _index(g, 5, 2, 3), -0.5), {}),
        ((_r(g, 4, 6, dtype=torch.int64), -1, _index(g, 6, 3, 6), 0), {}),
    ]


def scatter_reduce_samples() -> Samples:
    g = generator(24)
    out = []
    for reduce in ("sum", "mean", "amax", "amin", "prod"):
        for include_self in (True, False):
            out.append(((_r(g, 4, 5), 0, _index(g, 4, 6, 5), _r(g, 6, 5), reduce), {"include_self": include_self}))
    out.append(((_r(g, 4, 5, dtype=torch.int64), 1, _index(g, 5, 4, 3), _r(g, 4, 3, dtype=torch.int64), "mean"), {}))
    return out


def _with_out(row: Row, kwargs: Any) -> Row:
    """``.out`` variants: the ``out=`` tensor (last in pytree order) is laid out like the result."""
    return row + [row[0]] if isinstance(kwargs, dict) and "out" in kwargs else row


def _equal_size_dims(dim: int, *shapes: Any) -> list[int]:
    """Dims d != dim on which every operand has the same size (all operands same ndim)."""
    ndims = {len(s) for s in shapes}
    if len(ndims) != 1:
        return []
    ndim = ndims.pop()
    # statically known equal only: an unknown (unbacked) size is not sharded (safe, fewer strategies)
    return [d for d in range(ndim) if d != dim and all(size_is(s[d], shapes[0][d]) for s in shapes)]


def _shard_rows(dim: int, n_tensors: int, *shapes: Any) -> list[Row]:
    rows = []
    for d in _equal_size_dims(dim, *shapes):
        S = ShardingPlaceholder(d)
        rows.append([S] * (1 + n_tensors))
    return rows


def _either_partial(P: Placement) -> list[tuple[Placement, Placement]]:
    """(self, src) pairs where each is P or R, not both R."""
    return [(P, P), (P, R), (R, P)]


@register(aten.gather.default, cost=gather_cost, samples=gather_samples)
@register(aten.gather.out, gaps=ALIASED_UNPRICED)
def gather_strategy(op: Any, args: Any, kwargs: Any) -> list[Row]:
    """Equal-size dims shard together; index sharded on dim with self replicated; self sharded
    on dim with the index masked (functional form only: dispatch makes the mask); self Partial."""
    self_m, index_m = metas(args)[:2]
    dim = normalize_dim(args[1], len(self_m.shape))
    rows = _shard_rows(dim, 2, self_m.shape, index_m.shape)
    if len(index_m.shape) == len(self_m.shape) and len(index_m.shape) > 0:
        S = ShardingPlaceholder(dim)
        rows.append([S, R, S])
        masked = op == aten.gather.default and "sum" in partial_ops([self_m.dtype])
        if masked and mask_row_pays(dim, self_m.shape, index_m.shape) and mask_row_offered():
            rows.append(mask_row(dim, self_m.shape))
    for reduce_op in partial_ops([self_m.dtype]):
        P = Partial(reduce_op)
        rows.append([P, P, R])
    return [_with_out(r, kwargs) for r in rows]


def _scatter_parts(args: Any) -> tuple[Any, Any, Any, int]:
    ms = metas(args)
    self_m, index_m = ms[0], ms[1]
    src_m = ms[2]
    dim = normalize_dim(args[1], len(self_m.shape))
    return self_m, index_m, src_m, dim


def _index_sharded_sum_row(dim: int, self_m: Any, index_m: Any, src_m: Any) -> list[Row]:
    """(P(sum), P(sum), S(dim), S(dim)): each rank scatters its rows of src; valid if index/src rows align."""
    if (
        len(index_m.shape) == len(src_m.shape) == len(self_m.shape) > 0
        and size_is(index_m.shape[dim], src_m.shape[dim])
    ):
        P, S = Partial("sum"), ShardingPlaceholder(dim)
        return [[P, P, S, S]]
    return []


@register(aten.scatter_add.default, cost=scatter_cost, samples=scatter_add_samples)
@register(aten.scatter_add_.default, cost=scatter_cost, gaps=ALIASED_SAMPLES)
@register(aten.scatter_add.out, gaps=ALIASED_UNPRICED)
def scatter_add_strategy(op: Any, args: Any, kwargs: Any) -> list[Row]:
    """Equal-size dims shard together; linear in (self, src); index-sharded rows sum into P(sum)."""
    self_m, index_m, src_m, dim = _scatter_parts(args)
    rows = _shard_rows(dim, 3, self_m.shape, index_m.shape, src_m.shape)
    rows += _add_partial_rows(dim, self_m, index_m, src_m, index_sharded=True)
    return [_with_out(r, kwargs) for r in rows]


def _add_partial_rows(dim: int, self_m: Any, index_m: Any, src_m: Any, index_sharded: bool) -> list[Row]:
    rows: list[Row] = []
    ops = partial_ops([self_m.dtype, src_m.dtype])
    if "sum" in ops:
        P = Partial("sum")
        rows.append([P, P, R, P])
        if index_sharded:
            rows += _index_sharded_sum_row(dim, self_m, index_m, src_m)
    if "avg" in ops:
        A = Partial("avg")
        rows += [[A, s, R, x] for s, x in _either_partial(A)]
    for reduce_op in ("max", "min"):
        if reduce_op in ops:
            P = Partial(reduce_op)
            rows.append([P, P, R, R])
    return rows


@register(aten.scatter.src, cost=scatter_cost, samples=scatter_src_samples)
@register(aten.scatter_.src, cost=scatter_cost, gaps=ALIASED_SAMPLES)
@register(aten.scatter.src_out, gaps=ALIASED_UNPRICED)
def scatter_src_strategy(op: Any, args: Any, kwargs: Any) -> list[Row]:
    """Equal-size dims shard together; every output element copies one self/src element."""
    self_m, index_m, src_m, dim = _scatter_parts(args)
    rows = _shard_rows(dim, 3, self_m.shape, index_m.shape, src_m.shape)
    for reduce_op in partial_ops([self_m.dtype, src_m.dtype]):
        P = Partial(reduce_op)
        if reduce_op == "sum":
            rows.append([P, P, R, P])
        else:
            rows += [[P, s, R, x] for s, x in _either_partial(P)]
    return [_with_out(r, kwargs) for r in rows]


def _is_zero(value: Any) -> bool:
    try:
        return bool(size_is(value, 0))  # a symbolic scalar not known to be 0: do not assume
    except Exception:
        return False


@register(aten.scatter.value, cost=scatter_cost, samples=scatter_value_samples)
@register(aten.scatter_.value, cost=scatter_cost, gaps=ALIASED_SAMPLES)
@register(aten.scatter.value_out, gaps=ALIASED_UNPRICED)
def scatter_value_strategy(op: Any, args: Any, kwargs: Any) -> list[Row]:
    """Equal-size dims shard together; a written scalar survives mean/max/min, not sum."""
    self_m, index_m = metas(args)[:2]
    dim = normalize_dim(args[1], len(self_m.shape))
    rows = _shard_rows(dim, 2, self_m.shape, index_m.shape)
    value = args[3] if len(args) > 3 else (kwargs or {}).get("value")
    # writing 0 is the one case P(sum) survives: n copies of 0 sum to 0
    reduce_ops = ("sum", "avg", "max", "min") if _is_zero(value) else ("avg", "max", "min")
    for reduce_op in partial_ops([self_m.dtype], reduce_ops):
        P = Partial(reduce_op)
        rows.append([P, P, R])
    return [_with_out(r, kwargs) for r in rows]


# scatter_reduce with index and src replicated is a pointwise map of self: identity where nothing
# is written, and where something is written a constant c (include_self=False) or g(self, c).
# Which Partial of self survives depends on g: linear -> sum/avg, affine -> avg, monotone -> max/min.
_SELF_ONLY_OPS = {
    ("sum", True): ("avg", "max", "min"),  # self + c: affine and monotone
    ("mean", True): ("avg", "max", "min"),  # (self + c) / (k + 1); avg needs floats (checked below)
    ("amax", True): ("max", "min"),  # max(self, c): monotone
    ("amin", True): ("max", "min"),
    ("prod", True): ("sum", "avg"),  # self * c: linear, not monotone (c may be negative)
}


@register(aten.scatter_reduce.two, cost=scatter_cost, samples=scatter_reduce_samples)
@register(aten.scatter_reduce_.two, cost=scatter_cost, gaps=ALIASED_SAMPLES)
@register(aten.scatter_reduce.two_out, gaps=ALIASED_UNPRICED)
def scatter_reduce_strategy(op: Any, args: Any, kwargs: Any) -> list[Row]:
    """Equal-size dims shard together; Partial rows per reduce mode (see the module table)."""
    self_m, index_m, src_m, dim = _scatter_parts(args)
    kw = kwargs or {}
    reduce = args[4] if len(args) > 4 else kw["reduce"]
    include_self = bool(args[5] if len(args) > 5 else kw.get("include_self", True))
    rows = _shard_rows(dim, 3, self_m.shape, index_m.shape, src_m.shape)
    floating = self_m.dtype.is_floating_point and src_m.dtype.is_floating_point
    allowed = partial_ops([self_m.dtype, src_m.dtype])
    # self Partial, src replicated: see _SELF_ONLY_OPS; include_self=False writes constants
    self_only = _SELF_ONLY_OPS.get((reduce, include_self), ("avg", "max", "min"))
    for reduce_op in self_only:
        if reduce_op in allowed and not (reduce == "mean" and reduce_op == "avg" and not floating):
            P = Partial(reduce_op)
            rows.append([P, P, R, R])
    # src Partial too: jointly linear (sum, float mean) or a max of maxes (amax/amin)
    if reduce in ("sum", "mean") and (reduce == "sum" or floating):
        if "sum" in allowed:
            P = Partial("sum")
            rows.append([P, P, R, P])
        if "avg" in allowed:
            A = Partial("avg")
            rows += [[A, A, R, A], [A, R, R, A]]
    if reduce in ("amax", "amin"):
        reduce_op = "max" if reduce == "amax" else "min"
        if reduce_op in allowed:
            P = Partial(reduce_op)
            rows += [[P, P, R, P], [P, R, R, P]]
    # index and src sharded on dim: each rank folds its rows of src into its part of self;
    # only when self is folded in (include_self) and the fold is associative across ranks
    if include_self and _index_sharded_sum_row(dim, self_m, index_m, src_m):
        S = ShardingPlaceholder(dim)
        if reduce == "sum" and "sum" in allowed:
            rows.append([Partial("sum"), Partial("sum"), S, S])
        if reduce in ("amax", "amin"):
            reduce_op = "max" if reduce == "amax" else "min"
            if reduce_op in allowed:
                P = Partial(reduce_op)
                rows += [[P, P, S, S], [P, R, S, S]]
    return [_with_out(r, kwargs) for r in rows]

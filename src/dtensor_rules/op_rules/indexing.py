"""Advanced indexing: ``aten.index.Tensor`` (``x[i, :, j]``) and ``aten.index_put`` (``x[i, :, j] = v`` / ``+= v``).

Vocabulary. ``indices`` is a list of index tensors and ``None`` s; entry k addresses self dims
starting at the cursor: ``None`` keeps one dim ("non-indexed"), an integer tensor consumes one
dim, a bool/uint8 mask of rank r consumes r dims. The integer tensors broadcast together to
the *index shape* B (a mask contributes one trailing dim of data-dependent length: its nonzero
count). The *indexed view* ``self[indices]`` has B where the indexed dims were if the indexed
dims are adjacent, else B at the front; non-indexed dims keep their order. ``values`` of
index_put broadcasts (right-aligned) to the indexed view.

``index.Tensor`` per mesh dim, ``[out, self, *index tensors]``:

============================  ==========  ======================  ============================================
out                           self        index tensors           why it is valid
============================  ==========  ======================  ============================================
S(pos of d in result)         S(d)        R                       d non-indexed: every rank gathers its slice
S(B dim b)                    R           S(aligned dim) or R     each rank looks up its block of coordinates;
                                          (R where size 1)        indices hold global positions into full self
P(op), op in sum/avg/max/min  P(op)       R                       gather is a selection: it commutes with any
                                                                  elementwise reduction over ranks
R                             R           R                       implied
============================  ==========  ======================  ============================================

``index_put`` / ``index_put_`` / ``_index_put_impl_`` per mesh dim, ``[out, self, *indices, values]``:

=========================  ==========  ================  ===============  ==========================================
out                        self        index tensors     values           why it is valid
=========================  ==========  ================  ===============  ==========================================
S(d)                       S(d)        R                 S(aligned) / R   d non-indexed: each rank writes its slice
P(sum)   [accumulate]      P(sum)      S(aligned to b)   S(aligned) / R   out = sum_r self_r + sum_r scatter_add_r:
                                       or R                               every coordinate is added on one rank only
                                                                          (expert-parallel combine)
P(sum)                     P(sum)      R                 P(sum)           linear in (self, values), both modes
P(avg)                     P(avg)      R                 P(avg) or R      mean commutes with put/add of a
P(avg)                     R           R                 P(avg)           rank-invariant term
P(max/min) [not accum.]    P(op)       R                 P(op) or R       overwrite is a selection per element
P(max/min) [not accum.]    R           R                 P(op)
P(max/min) [accumulate]    P(op)       R                 R                max_r(self_r + c) = max(self) + c
S(d), d under a mask       S(d)        mask S(its dim),  R, broadcast     every selected element gets the same
                                       others R          along nonzeros   value: each rank writes its own chunk
R                          R           R                 R                implied
=========================  ==========  ================  ===============  ==========================================

Not offered (each has a counterexample): self sharded on an indexed dim (indices are global
positions); sharded index tensors without accumulate (the other ranks' coordinates keep the
old self values); P(sum) with a replicated self or values (counted once per rank); P(max)
values with accumulate (duplicates add several values); masks sharded (the result length per
rank is data dependent, not a chunk) unless values is constant along the nonzero list. In-place variants only get strategies with out == self.
``Partial`` needs a non-bool dtype, ``P(avg)`` a floating one. Symbolic sizes: whether an index or
values dim broadcasts (size 1) must be statically known; if not, rows that depend on it are dropped.

Offered at dispatch, not to solvers. The ``P(avg)`` / ``P(max/min)`` rows of ``index_put`` with
a ``Replicate`` self or values (``(P, R, P)`` and ``(P, P, R)`` over ``[self, indices, values]``)
are correct: the mean, max or min of a replicated operand is itself. An eager call holds one
layout per input, so dispatch takes such a row only where the operand IS replicated, and saves an
all-reduce there. A solver is offered ``(P, P, P)`` instead and prices the ``Replicate ->
Partial`` move of that operand itself (:mod:`dtensor_rules.op_rules._solver_rows`): a solver that
prices that move as impossible and a switch of Partial kind as free (AutoParallel) would
otherwise pass a ``Partial(sum)`` value next to the replicated operand disguised as a mean
(docs/solver.md, "AutoParallel's free partial switch").

Duplicate coordinates with ``accumulate=False`` are nondeterministic on one device already; the
strategies above keep the same "one write wins" semantics per rank but a sum of per-rank
partials can mix winners, so the sample suites keep such indices unique.

Bool masks through DTensor. torch 2.13's DTensor cannot size ``x[mask]`` in its fake-tensor
meta step (``aten.nonzero`` has a data-dependent shape) and fails before consulting any rule.
The ``cache_miss_hook`` patch (:mod:`dtensor_rules.dispatch.cache_miss`) catches such calls on
DTensor's sharding-cache miss (they always miss), checks the mask shapes (torch's IndexError),
turns each replicated mask into the long index tensors it stands for and runs the call with
them through this rule. Calls without masks never see it: after their first call they are
served by DTensor's C++ fast path like any op.

Layouts the validator finds valid on the suites but not emitted, each valid only by luck of the
sample: a Partial(max/min) INDEX tensor (ranks hold different, still in-range indices; the
gathered rows differ); P(max/min) values with ``accumulate=True`` when the integer coordinates
happen to be unique (with a duplicate, max_r(self + v1_r + v2_r) != self + max v1 + max v2).
Valid but not emitted: the same P(max/min)-values row when every index is a bool mask (a mask
never repeats a coordinate).

Cost (memory-bound, priced by the elements touched; ``isz`` = element size of self):

=================================  ==========================================  =========================  =================
op                                 bytes read                                  bytes written              flops
=================================  ==========================================  =========================  =================
index(self, indices)               indices + k_out * isz (+ mask cost)         k_out * isz (+ coords)     0
index_put(self, indices, values)   self (copy) + indices + values (+ mask)     self (copy) + k * isz (+)  0
index_put(accumulate=True)         as index_put + k * isz                      as index_put               k
=================================  ==========================================  =========================  =================

"indices" and "values" count the distinct bytes of the tensor (stride-0 dims once). ``k`` is
the number of positions the indices select (broadcast of integer indices, count of True in
boolean masks) and ``k_out = k *`` the non-indexed dims. Boolean masks are counted from the data
when concrete; on fake/meta tensors every element is assumed True (an upper bound,
``exact=False``). A mask is first converted to int64 coordinates (``nonzero``): "mask cost" =
the mask's bytes read plus ``k * mask.ndim * 8`` bytes of coordinates written and the same read
back. Families (``OpCost.family``): ``index`` for row-granular access (>= 16 contiguous elements
per position: the kernel streams runs), else ``gather`` (index) or ``scatter`` (index_put).

Samples: uneven shapes, several / broadcasting / separated index tensors, None entries, negative
indices, bool masks, duplicates, bf16 and int64. ``accumulate=False`` samples keep index
coordinates unique: with duplicates the written value is nondeterministic on one device already.
``accumulate=True`` samples include duplicates. ``index.Tensor`` has no bool-mask sample: its
output shape is data dependent, which neither DTensor nor the fake-tensor step of the validator
can handle.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch._ops import OpOverload
from torch.distributed.tensor.placement_types import Partial, Replicate

from dtensor_rules._upstream import ShardingPlaceholder, TensorMeta
from dtensor_rules.costs._util import broadcast_shape, CostError, is_concrete, nbytes, numel
from dtensor_rules.costs.formulas import formula
from dtensor_rules.costs.op_cost import OpCost
from dtensor_rules.dispatch import cache_miss  # noqa: F401  (registers the cache_miss_hook patch)
from dtensor_rules.op_rules._common import generator, PlacementOrHole, Samples, size_is
from dtensor_rules.op_rules._gaps import ALIASED_SAMPLES, ALIASED_UNPRICED, HACKED_TWIN
from dtensor_rules.registry import register

aten = torch.ops.aten

INDEX = [aten.index.Tensor, aten.index.Tensor_out, aten.index.Tensor_hacked_twin]
INDEX_PUT = [aten.index_put.default, aten.index_put.out, aten.index_put.hacked_twin]
INDEX_PUT_INPLACE = [
    aten.index_put_.default,
    aten.index_put_.hacked_twin,
    aten._index_put_impl_.default,
]

_MASK = -1  # size marker of a mask's data-dependent dim in the index shape


# --------------------------------------------------------------------------- cost formula

_MASK_NOTE = "boolean mask values unknown (fake/meta): all True assumed (upper bound)"


ROW_ELEMS = 16  # elements per indexed position from which a kernel copies contiguous runs ("index" family)


def _indexed_positions(self: torch.Tensor, indices: list[Any], op: OpOverload) -> tuple[int, int, bool, int, int]:
    """(k positions, elements per position from non-indexed dims, exact, mask bytes read, mask bytes written).

    A boolean mask is first turned into int64 coordinates (``nonzero``): its cost is the
    mask read plus ``k * mask.ndim`` int64 coordinates written and read back.
    """
    shapes: list[tuple[int, ...]] = []
    kept: list[int] = []
    d, exact, mask_read, mask_written = 0, True, 0, 0
    for idx in indices:
        if idx is None:
            if d >= self.dim():
                raise CostError(f"{op}: too many indices for a {self.dim()}-d tensor")
            kept.append(int(self.shape[d]))
            d += 1
        elif idx.dtype in (torch.bool, torch.uint8):
            if is_concrete(idx):
                true = int(torch.count_nonzero(idx))
            else:
                true = numel(idx)
                exact = False
            shapes.append((true,))
            coords = true * idx.dim() * torch.int64.itemsize
            mask_read += nbytes(idx) + coords
            mask_written += coords
            d += idx.dim()
        else:
            shapes.append(tuple(idx.shape))
            d += 1
    if d > self.dim():
        raise CostError(f"{op}: indices address {d} dims of a {self.dim()}-d tensor")
    kept += [int(s) for s in self.shape[d:]]
    k = numel(broadcast_shape(*shapes)) if shapes else 1
    return k, math.prod(kept), exact, mask_read, mask_written


def _index_family(per: int) -> str:
    """Row-granular indexing (>= ROW_ELEMS contiguous elements per position) vs element-granular."""
    return "index" if per >= ROW_ELEMS else "gather"


def _idx_bytes(indices: list[Any]) -> int:
    return sum(nbytes(i) for i in indices if i is not None and i.dtype not in (torch.bool, torch.uint8))


@formula(family="index")
def index_cost(op: OpOverload, b: dict[str, Any]) -> OpCost:
    self, indices = b["self"], list(b["indices"])
    k, per, exact, mask_read, mask_written = _indexed_positions(self, indices, op)
    out = k * per * self.dtype.itemsize
    return OpCost(0, _idx_bytes(indices) + mask_read + out, out + mask_written, dtype=self.dtype, exact=exact,
                  note="" if exact else _MASK_NOTE, family=_index_family(per))


@formula(family="index")
def index_put_cost(op: OpOverload, b: dict[str, Any]) -> OpCost:
    self, indices, values = b["self"], list(b["indices"]), b["values"]
    k, per, exact, mask_read, mask_written = _indexed_positions(self, indices, op)
    isz = self.dtype.itemsize
    elems = k * per
    read = _idx_bytes(indices) + mask_read + nbytes(values)
    written = elems * isz + mask_written
    flops = 0
    if b["accumulate"]:
        read += elems * isz
        flops = elems
    if op is aten.index_put.default:
        read += nbytes(self)
        written += numel(self) * isz
    family = "scatter" if per < ROW_ELEMS else "index"
    return OpCost(flops, read, written, dtype=self.dtype, exact=exact, note="" if exact else _MASK_NOTE, family=family)


# --------------------------------------------------------------------------- sample suites

def _t(*vals: int) -> torch.Tensor:
    return torch.tensor(vals)


def index_samples() -> Samples:
    g = generator(10)
    r = lambda *s, dtype=torch.float32: torch.randn(*s, generator=g).to(dtype)  # noqa: E731
    return [
        ((r(6, 5), [_t(0, 3, 3, -1)]), {}),  # duplicates, negative index, uneven dim
        ((r(5, 4, 3), [None, _t(2, 0, 1)]), {}),  # index a middle dim
        ((r(5, 4, 3), [_t(4, 0).reshape(2, 1), None, _t(0, 2, 1)]), {}),  # separated: B goes to the front
        ((r(4, 5, 3, dtype=torch.bfloat16), [None, _t(0, 4, 2), _t(1, 1, 0)]), {}),  # adjacent pair
        ((torch.randint(-9, 9, (7, 3), generator=g), [_t(1, 6, 6, 0, 2, 3).reshape(2, 3)]), {}),  # 2-D index, int64
    ]


def index_put_samples() -> Samples:
    g = generator(11)
    r = lambda *s, dtype=torch.float32: torch.randn(*s, generator=g).to(dtype)  # noqa: E731
    mask = torch.tensor([[1, 0, 1], [0, 0, 1], [1, 1, 0], [0, 1, 1]], dtype=torch.bool)
    return [
        ((r(6, 5), [_t(4, 0, 2)], r(3, 5), False), {}),
        ((r(6, 5), [_t(4, 0, 4, 1)], r(4, 5), True), {}),  # duplicates accumulate
        ((r(5, 4, 3), [_t(4, 0).reshape(2, 1), None, _t(0, 2, 1)], r(2, 3, 4), True), {}),  # separated, broadcast
        ((r(4, 5, 3, dtype=torch.bfloat16), [None, _t(0, 4, 2), _t(1, 1, 0)], r(3, dtype=torch.bfloat16), False), {}),
        ((r(4, 3), [mask], r(1), False), {}),  # 2-D mask, broadcast scalar value
        ((r(5, 4), [_t(1, 0, 1, 1, 0).bool()], r(4), True), {}),  # 1-D mask, values broadcast over rows
        ((torch.randint(-9, 9, (7, 3), generator=g), [_t(1, 6, 1, 0)], torch.randint(-9, 9, (4, 3), generator=g), True), {}),
    ]


@dataclass(frozen=True)
class IndexLayout:
    """Where each self dim and each index-shape dim lands in ``self[indices]``."""

    self_ndim: int
    index_shapes: tuple[tuple[int, ...], ...]  # per non-None index tensor; a mask is (_MASK,)
    non_indexed: tuple[int, ...]  # self dims kept, in order
    index_ndim: int  # rank of the broadcast index shape B
    insert: int  # position of B in the result
    masks: tuple[tuple[int, int, int], ...] = ()  # (index tensor slot, first self dim, rank) per mask

    @property
    def result_ndim(self) -> int:
        return self.index_ndim + len(self.non_indexed)

    def result_pos(self, d: int) -> int:
        """Result dim of non-indexed self dim ``d``."""
        before = [k for k in self.non_indexed if k < d]
        i = len(before)
        return i if i < self.insert else i + self.index_ndim

    def index_size(self, b: int) -> int:
        """Size of broadcast index dim ``b`` (``_MASK`` if a mask's dim, 1 if all broadcast)."""
        size = 1
        for shape in self.index_shapes:
            k = b - (self.index_ndim - len(shape))
            if k >= 0 and size_is(shape[k], 1) is not True:
                size = shape[k]
        return size

    def index_placements(self, b: int) -> list[PlacementOrHole] | None:
        """Per index tensor, the placement that splits broadcast dim ``b``; None if impossible."""
        out: list[PlacementOrHole] = []
        for shape in self.index_shapes:
            k = b - (self.index_ndim - len(shape))
            if k >= 0 and isinstance(shape[k], int) and shape[k] == _MASK:
                return None  # a mask's nonzero list cannot be cut into chunks
            one = True if k < 0 else size_is(shape[k], 1)
            if one is None:
                return None  # broadcast or not depends on data: do not split
            out.append(Replicate() if one else ShardingPlaceholder(k))
        return out


class _ZeroDimMask(Exception):
    """``x[True]``: a 0-d mask inserts a new dim; only the Partial strategies are derived for it."""


def index_layout(self_meta: TensorMeta, indices: Any) -> IndexLayout:
    ndim = len(self_meta.shape)
    cursor = 0
    indexed: list[int] = []
    shapes: list[tuple[int, ...]] = []
    masks: list[tuple[int, int, int]] = []
    for idx in indices:
        if idx is None:
            cursor += 1
            continue
        if idx.dtype in (torch.bool, torch.uint8):
            if len(idx.shape) == 0:
                raise _ZeroDimMask
            r = len(idx.shape)
            masks.append((len(shapes), cursor, r))
            indexed += range(cursor, cursor + r)
            shapes.append((_MASK,))
            cursor += r
        else:
            indexed.append(cursor)
            shapes.append(tuple(idx.shape))
            cursor += 1
    if cursor > ndim:
        raise IndexError(f"too many indices for tensor of dimension {ndim} (got {cursor})")
    adjacent = bool(indexed) and indexed == list(range(indexed[0], indexed[-1] + 1))
    non_indexed = tuple(d for d in range(ndim) if d not in set(indexed))
    insert = sum(1 for d in non_indexed if indexed and d < indexed[0]) if adjacent else 0
    index_ndim = max((len(s) for s in shapes), default=0)
    return IndexLayout(ndim, tuple(shapes), non_indexed, index_ndim, insert, tuple(masks))


def _partial_ops(dtype: torch.dtype) -> tuple[str, ...]:
    if dtype == torch.bool:
        return ()
    return ("sum", "avg", "max", "min") if dtype.is_floating_point or dtype.is_complex else ("sum", "max", "min")


@register(aten.index.Tensor, cost=index_cost, samples=index_samples)
@register(aten.index.Tensor_out, gaps=ALIASED_UNPRICED)
@register(aten.index.Tensor_hacked_twin, gaps=HACKED_TWIN)
def index_strategy(op: Any, args: Any, kwargs: Any) -> list[list[PlacementOrHole]]:
    """Pass non-indexed dims through, split the index shape with the index tensors, pass any Partial."""
    self_meta, indices = args[0], args[1]
    has_out = "out" in kwargs
    R = Replicate()
    try:
        lay = index_layout(self_meta, indices)
    except _ZeroDimMask:
        n = sum(1 for i in indices if i is not None)
        return [[Partial(o), Partial(o), *[R] * n] + ([Partial(o)] if has_out else []) for o in _partial_ops(self_meta.dtype)]
    n_idx = len(lay.index_shapes)

    def row(out: PlacementOrHole, self_p: PlacementOrHole, idx: list[PlacementOrHole]) -> list[PlacementOrHole]:
        return [out, self_p, *idx] + ([out] if has_out else [])

    strategies = [row(ShardingPlaceholder(lay.result_pos(d)), ShardingPlaceholder(d), [R] * n_idx) for d in lay.non_indexed]
    for b in range(lay.index_ndim):
        idx_p = lay.index_placements(b)
        if idx_p is None or all(isinstance(p, Replicate) for p in idx_p):
            continue
        strategies.append(row(ShardingPlaceholder(lay.insert + b), R, idx_p))
    for reduce_op in _partial_ops(self_meta.dtype):
        strategies.append(row(Partial(reduce_op), Partial(reduce_op), [R] * n_idx))
    return strategies


def _values_placement(lay: IndexLayout, values: TensorMeta, result_dim: int) -> PlacementOrHole | None:
    """values is right-aligned to the indexed view; shard its aligned dim unless it broadcasts
    (None when whether it broadcasts depends on a symbolic size: no strategy then)."""
    k = result_dim - (lay.result_ndim - len(values.shape))
    one = True if k < 0 else size_is(values.shape[k], 1)
    if one is None:
        return None
    return Replicate() if one else ShardingPlaceholder(k)


def _same(p: PlacementOrHole, q: PlacementOrHole) -> bool:
    if isinstance(p, ShardingPlaceholder) or isinstance(q, ShardingPlaceholder):
        return type(p) is type(q) and p.dim == q.dim  # type: ignore[union-attr]
    return p == q


def _mask_strategies(lay: IndexLayout, values: TensorMeta, row: Any) -> list[list[PlacementOrHole]]:
    """A mask's dims may be split together with self's dims under it, when the written value is the same
    for every selected coordinate (values broadcast along the mask's nonzero dim, other index tensors too):
    then each rank writes exactly the selected elements of its own chunk."""
    out: list[list[PlacementOrHole]] = []
    b = lay.index_ndim - 1  # a mask's nonzero list is the last dim of the index shape
    if not lay.masks or not isinstance(_values_placement(lay, values, lay.insert + b), Replicate):
        return out
    for slot, first, rank in lay.masks:
        others = [s for i, s in enumerate(lay.index_shapes) if i != slot]
        if any(len(s) and size_is(s[-1], 1) is not True for s in others):  # another index tensor (or mask) varies along the nonzero list
            continue
        for k in range(rank):
            idx_p: list[PlacementOrHole] = [Replicate()] * len(lay.index_shapes)
            idx_p[slot] = ShardingPlaceholder(k)
            out.append(row(ShardingPlaceholder(first + k), ShardingPlaceholder(first + k), idx_p, Replicate()))
    return out


@register(aten.index_put.default, cost=index_put_cost, samples=index_put_samples)
@register([aten.index_put_.default, aten._index_put_impl_.default], cost=index_put_cost, gaps=ALIASED_SAMPLES)
@register(aten.index_put.out, gaps=ALIASED_UNPRICED)
@register([aten.index_put.hacked_twin, aten.index_put_.hacked_twin], gaps=HACKED_TWIN)
def index_put_strategy(op: Any, args: Any, kwargs: Any) -> list[list[PlacementOrHole]]:
    """Non-indexed dims pass through; accumulate allows the sharded-index combine into P(sum); Partial by linearity."""
    self_meta, indices, values = args[0], args[1], args[2]
    accumulate = bool(args[3]) if len(args) > 3 else bool(kwargs.get("accumulate", False))
    has_out = "out" in kwargs
    inplace = op in INDEX_PUT_INPLACE
    R = Replicate()
    try:
        lay = index_layout(self_meta, indices)
    except _ZeroDimMask:  # no layout: keep only the Partial rows below (they need no dim mapping)
        lay = IndexLayout(len(self_meta.shape), tuple((1,) for i in indices if i is not None), (), 0, 0)
    n_idx = len(lay.index_shapes)

    def row(out: PlacementOrHole, self_p: PlacementOrHole, idx: list[PlacementOrHole], v: PlacementOrHole) -> list[PlacementOrHole]:
        return [out, self_p, *idx, v] + ([out] if has_out else [])

    strategies = [
        row(ShardingPlaceholder(d), ShardingPlaceholder(d), [R] * n_idx, v)
        for d in lay.non_indexed
        if (v := _values_placement(lay, values, lay.result_pos(d))) is not None
    ]
    strategies += _mask_strategies(lay, values, row)
    ops = _partial_ops(self_meta.dtype)
    if accumulate and "sum" in ops:
        for b in range(lay.index_ndim):
            idx_p = lay.index_placements(b)
            if idx_p is None or all(isinstance(p, Replicate) for p in idx_p):
                continue
            P = Partial("sum")
            v = _values_placement(lay, values, lay.insert + b)
            if v is not None:
                strategies.append(row(P, P, idx_p, v))
    for reduce_op in ops:
        P = Partial(reduce_op)
        if reduce_op == "sum":
            strategies.append(row(P, P, [R] * n_idx, P))
            continue
        if reduce_op == "avg" or not accumulate:
            strategies += [row(P, P, [R] * n_idx, P), row(P, P, [R] * n_idx, R), row(P, R, [R] * n_idx, P)]
        else:  # max/min with accumulate: only a rank-invariant addend commutes with max
            strategies.append(row(P, P, [R] * n_idx, R))
    if inplace:
        strategies = [s for s in strategies if _same(s[0], s[1])]
    return strategies

"""``aten.cat`` and ``aten.slice_scatter``: ops that place whole blocks of their inputs into the output.

Both are *linear in all tensor inputs jointly* and every output element is a copy of
exactly one input element (a *selection*), which is what lets Partial placements pass.

``cat(tensors, dim)`` — strategies per mesh dim, ``[out, t_1, ..., t_n]`` (+ ``out=``):

=================================  ==========================================  ==============================================
out                                inputs                                      why it is valid
=================================  ==========================================  ==============================================
S(d), d != cat dim                 every input S(d)                            all inputs have equal size on d, so their
                                                                               chunks on d line up with the output's chunks
S(cat dim)                         every input S(cat dim)                      only when at most ONE input is non-empty on the
                                                                               cat dim: the output *is* that input (else the
                                                                               local cats interleave the inputs)
P(sum)                             every input P(sum)                          linear: sum_r cat(x_r) = cat(sum_r x_r)
P(avg) / P(max) / P(min)           any non-empty subset of inputs P(op), the   each output element is a copy of one input
                                   others R                                    element: the mean, max, min of a replicated
                                                                               value is itself, of a Partial one its value
a zero-element input: R or any     any row above (a non-legacy empty input     it contributes nothing, and its local piece is
P(op) its dtype allows             only in rows sharding no non-cat dim)       empty too; a non-legacy one must still match
                                                                               the others' local sizes off the cat dim
P(avg) / P(max) / P(min)           all R except a zero-element input laid      every rank holds the whole result
                                   out otherwise
R                                  every input R                               implied
=================================  ==========================================  ==============================================

Legacy empty inputs (shape ``(0,)``) are skipped by cat. Partial rows are offered only for
reduce ops all input dtypes (and the promoted output dtype) support (no bool; avg needs floats).
Caps (documented, valid rows left out): the subsets are enumerated for up to
``MAX_SUBSET_INPUTS`` = 6 non-legacy inputs (2^6 - 1 rows per reduce op); with more, only
"all" and "exactly one" are offered and dispatch reaches the rest by redistributing an
operand. Only the first ``MAX_FREE_INPUTS`` = 2 zero-element inputs get alternatives.
Not valid: the cat dim sharded with two non-empty inputs; P(sum) mixed with R (the
replicated operand would be summed n times).

``slice_scatter(self, src, dim, start, end, step)`` — ``[out, self, src]`` (+ ``out=``):

=================================  ==========================================  ==============================================
out                                self, src                                   why it is valid
=================================  ==========================================  ==============================================
S(d), d != slice dim               S(d), S(d)                                  self and src have equal sizes on every d != dim,
                                                                               so rows line up; the slice is along another dim
P(sum)                             P(sum), P(sum)                              linear in (self, src) jointly
P(avg) / P(max) / P(min)           P(op), P(op) | P(op), R | R, P(op)          each output element is a copy of one element of
                                                                               self or src: mean/max/min of a replicated
                                                                               operand is itself
X in {R, P(op)}                    X, any of R/P(op')                          slice is EMPTY: out == self whatever src holds
X in {R, P(op)}                    any of R/P(op'), X                          slice is FULL (covers all of dim, step 1):
                                                                               out == src whatever self holds
S(dim)                             S(dim), S(dim)                              slice is FULL: out == src, and the local slice
                                                                               [start:end] clamps to the whole local shard
P(avg) / P(max) / P(min)           R, any | any, R                             slice EMPTY | FULL and the passed operand
                                                                               replicated: every rank holds the whole result
S(dim)                             S(dim), R/P(op)                             slice is EMPTY and start, end are not of mixed
                                                                               sign: start >= end survives clamping to a
                                                                               shorter shard, so every local slice is empty
                                                                               ([-2:3] is empty on 6 rows, not on 3)
R                                  R, R                                        implied
=================================  ==========================================  ==============================================

src is cast to self's dtype; when that truncates (float src, integer self) src may not be
P(sum)/P(avg) (truncating each part is not truncating the sum); max/min survive (monotone).
Not valid in general: the slice dim of self sharded (each rank would apply the *global*
start/end/step to its local chunk); self and src on different dims; P(sum) with one
operand replicated (unless the slice is empty/full as above).
Upstream torch 2.13: cat offers one follow-the-exemplar strategy per input layout with no
Partial max/min mixing and no cat-dim case; slice_scatter forces src to follow self, drops
tensor_meta on inputs and never lets Partial through.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
from dtensor_rules._upstream import ShardingPlaceholder
from torch.distributed.tensor.placement_types import Partial, Placement, Replicate

from dtensor_rules.costs.formulas.indexing import cat_cost, slice_scatter_cost
from dtensor_rules.ops._common import PlacementOrHole, metas, normalize_dim, numel
from dtensor_rules.ops._gaps import ALIASED_UNPRICED
from dtensor_rules.ops._partial import partial_ops
from dtensor_rules.registry import register
from dtensor_rules.testing.suites.slicing import cat_samples, slice_scatter_samples

aten = torch.ops.aten
CAT = [aten.cat.default, aten.cat.out]
SLICE_SCATTER = [aten.slice_scatter.default, aten.slice_scatter.out]

Row = list[PlacementOrHole]


def _with_out(row: Row, kwargs: Any) -> Row:
    """``.out`` variants: the ``out=`` tensor (last in pytree order) is laid out like the result."""
    return row + [row[0]] if isinstance(kwargs, dict) and "out" in kwargs else row


def _is_legacy_empty(shape: Any) -> bool:
    """cat skips 1-D tensors with no elements, whatever the other inputs' ndim."""
    return len(shape) == 1 and shape[0] == 0


# cat: all 2^n - 1 subsets of Partial(avg/max/min) inputs are emitted up to this many inputs
# (63 rows per reduce op); beyond it only "all" and "exactly one" (dispatch reaches the others
# by redistributing an operand). Real MoE code cats a handful of tensors.
MAX_SUBSET_INPUTS = 6
# zero-element inputs contribute nothing, so they may be laid out any way; rows are multiplied
# by the 1 + 4 choices of each, for at most this many of them
MAX_FREE_INPUTS = 2


@register(aten.cat.default, cost=cat_cost, samples=cat_samples)
@register(aten.cat.out, gaps=ALIASED_UNPRICED)
def cat_strategy(op: Any, args: Any, kwargs: Any) -> list[Row]:
    """Non-cat dims shard together; Partial passes (any subset for avg/max/min); the cat dim only
    if one input is non-empty; zero-element inputs are free."""
    tensors = list(args[0])
    dim_arg = args[1] if len(args) > 1 else (kwargs or {}).get("dim", 0)
    real = [i for i, t in enumerate(tensors) if not _is_legacy_empty(t.shape)]
    if not real:
        return []  # every input is a legacy empty tensor: only the implied all-Replicate
    ndim = len(tensors[real[0]].shape)
    cat_dim = normalize_dim(dim_arg, ndim)
    n = len(tensors)
    R = Replicate()

    def row(out: PlacementOrHole, per_input: dict[int, PlacementOrHole]) -> Row:
        return [out] + [per_input.get(i, R) for i in range(n)]

    strategies: list[Row] = []
    for d in range(ndim):
        if d == cat_dim:
            non_empty = [i for i in real if tensors[i].shape[cat_dim] != 0]
            if len(non_empty) > 1:
                continue
        S = ShardingPlaceholder(d)
        strategies.append(row(S, {i: S for i in real}))
    out_dtype = tensors[0].dtype
    for t in tensors[1:]:
        out_dtype = torch.promote_types(out_dtype, t.dtype)
    # all inputs replicated: every rank holds the whole result, and its mean/max/min over ranks
    # is itself; listed only as a base for free (zero-element) inputs laid out otherwise
    replicated_rows = [row(R, {})]
    for reduce_op in partial_ops([tensors[i].dtype for i in real] + [out_dtype]):
        P = Partial(reduce_op)
        if reduce_op == "sum" or len(real) == 1:
            strategies.append(row(P, {i: P for i in real}))
        elif len(real) <= MAX_SUBSET_INPUTS:
            for k in range(1, len(real) + 1):
                strategies += [row(P, {i: P for i in subset}) for subset in itertools.combinations(real, k)]
        else:
            strategies.append(row(P, {i: P for i in real}))
            strategies += [row(P, {i: P}) for i in real]
        if reduce_op != "sum":
            replicated_rows.append(row(P, {}))
    strategies += _free_empty_inputs(strategies + replicated_rows, tensors, cat_dim, real)
    return [_with_out(r, kwargs) for r in strategies]


def _free_empty_inputs(rows: list[Row], tensors: list[Any], cat_dim: int, real: list[int]) -> list[Row]:
    """A zero-element input adds nothing to the result, so any Replicate / Partial layout of it
    (its local piece is empty too) gives the same output: offer each, for up to MAX_FREE_INPUTS.

    A legacy ``(0,)`` input is skipped by cat whatever the row; any other empty input must still
    match the others' local sizes off the cat dim, so it is freed only in rows that shard no
    other dim. Returns only the new rows (``rows`` with a free input changed).
    """
    free = [i for i, t in enumerate(tensors) if numel(t.shape) == 0][:MAX_FREE_INPUTS]
    out = list(rows)
    for i in free:
        choices: list[PlacementOrHole] = [Replicate()] + [Partial(o) for o in partial_ops([tensors[i].dtype])]
        legacy = i not in real
        out = [
            r[: 1 + i] + [c] + r[2 + i :]
            for r in out
            for c in choices
            if c != r[1 + i]
            and (legacy or not any(isinstance(p, ShardingPlaceholder) and p.dim != cat_dim for p in r))
        ] + out
    seen = {tuple(map(str, r)) for r in rows}
    return [r for r in out if tuple(map(str, r)) not in seen]


def _signs_differ(start: int | None, end: int | None) -> bool:
    """A negative start (counted from the END of each shard) with a non-negative end."""
    return start is not None and start < 0 and (end is None or end >= 0)


def slice_length(size: int, start: int | None, end: int | None, step: int) -> tuple[int, int]:
    """(first index, number of elements) of ``x[start:end:step]`` along a dim of ``size``.

    torch clamps out-of-range bounds exactly like Python slicing (step must be positive).
    """
    if step <= 0:
        raise ValueError(f"slice step must be positive, got {step}")
    lo, hi, st = slice(start, end, step).indices(size)
    return lo, len(range(lo, hi, st))


@register(aten.slice_scatter.default, cost=slice_scatter_cost, samples=slice_scatter_samples)
@register(aten.slice_scatter.out, gaps=ALIASED_UNPRICED)
def slice_scatter_strategy(op: Any, args: Any, kwargs: Any) -> list[Row]:
    """Shard dims other than the slice dim together; Partial passes (linear, a selection)."""
    self_m, src_m = metas(args)[:2]
    names = ("dim", "start", "end", "step")
    defaults = (0, None, None, 1)
    kw = kwargs or {}
    dim, start, end, step = (
        args[2 + i] if len(args) > 2 + i else kw.get(name, default) for i, (name, default) in enumerate(zip(names, defaults))
    )
    ndim = len(self_m.shape)
    dim = normalize_dim(dim, ndim)
    size = self_m.shape[dim] if ndim else 1
    first, length = slice_length(size, start, end, step)
    empty = length == 0
    full = length == size and step == 1 and first == 0

    def row(out: PlacementOrHole, s: PlacementOrHole, src: PlacementOrHole) -> Row:
        return _with_out([out, s, src], kwargs)

    strategies: list[Row] = []
    for d in range(ndim):
        if d != dim or full:
            S = ShardingPlaceholder(d)
            strategies.append(row(S, S, S))
    R: Placement = Replicate()
    ops = partial_ops([self_m.dtype, src_m.dtype])
    # src is cast to self's dtype: float -> integer truncates, which is monotone (max/min
    # survive) but not linear (a Partial(sum) src would be truncated part by part)
    truncating = src_m.dtype.is_floating_point and not self_m.dtype.is_floating_point
    src_ops = tuple(o for o in ops if not (truncating and o in ("sum", "avg")))
    for reduce_op in ops:
        P = Partial(reduce_op)
        if reduce_op in src_ops:
            strategies.append(row(P, P, P))
        if reduce_op != "sum":
            strategies.append(row(P, P, R))
            if reduce_op in src_ops:
                strategies.append(row(P, R, P))
    # an empty slice leaves self untouched (src may be laid out any way); a full slice
    # returns src (self may be laid out any way): the ignored operand is free
    self_kept = [R] + [Partial(o) for o in ops]
    src_kept = [R] + [Partial(o) for o in src_ops]
    # a replicated passed operand gives every rank the whole result: any mean/max/min of it is itself
    spread = [Partial(o) for o in ops if o != "sum"]
    for passed in self_kept:
        for ignored in src_kept:
            if empty and passed != ignored and not (passed == R and ignored == R):
                strategies.append(row(passed, passed, ignored))
                if passed == R:
                    strategies += [row(p, R, ignored) for p in spread]
    for passed in src_kept:
        for ignored in self_kept:
            if full and passed != ignored and not (passed == R and ignored == R):
                strategies.append(row(passed, ignored, passed))
                if passed == R:
                    strategies += [row(p, ignored, R) for p in spread]
    if empty and ndim and not _signs_differ(start, end):
        # the local slice of an empty global slice is empty too (start >= end survives clamping to
        # a shorter shard), so self may be split on the slice dim; src has no elements to place.
        # Not with a negative start and non-negative end: [-2:3] is empty on 6 rows, not on 3.
        S = ShardingPlaceholder(dim)
        strategies += [row(S, S, ignored) for ignored in src_kept]
    return strategies

"""``aten.cat`` and ``aten.slice_scatter``: ops that place whole blocks of their inputs into the output.

Both are *linear in all tensor inputs jointly* and every output element is a copy of
exactly one input element (a *selection*), which is what lets Partial placements pass —
as long as the op's dtype cast keeps the reduction (:mod:`dtensor_rules.op_rules._casts`):
a Partial(sum/avg) input must already have the output's dtype; Partial(max/min) survives
monotone casts only.

``cat(tensors, dim)`` — strategies per mesh dim, ``[out, t_1, ..., t_n]`` (+ ``out=``);
``E(op)`` = the non-empty inputs whose cast to the promoted dtype keeps ``op``:

=================================  ==========================================  ==============================================
out                                inputs                                      why it is valid
=================================  ==========================================  ==============================================
S(d), d != cat dim                 every input S(d)                            all inputs have equal size on d, so their
                                                                               chunks on d line up with the output's chunks
S(cat dim)                         every input S(cat dim)                      only when at most ONE input is non-empty on the
                                                                               cat dim: the output *is* that input (else the
                                                                               local cats interleave the inputs)
P(sum)                             every input P(sum), all of the output's     linear: sum_r cat(x_r) = cat(sum_r x_r); the
                                   dtype                                       sum of cast parts is not the cast of the sum
P(avg) / P(max) / P(min)           a non-empty subset of E(op) P(op), the      each output element is a copy of one input
                                   others R (every subset up to                element: the mean, max, min of a replicated
                                   ``MAX_SUBSET_INPUTS`` inputs in E(op),      value is itself, of a Partial one its value
                                   beyond that all of E(op) and each one;      (through a monotone cast for max/min)
                                   dispatch scores only the subset that is
                                   Partial now)
a zero-element input: R or any     any row above (a non-legacy empty input     it contributes nothing, and its local piece is
P(op) its dtype allows             only in rows sharding no non-cat dim)       empty too; a non-legacy one must still match
                                                                               the others' local sizes off the cat dim
P(avg) / P(max) / P(min)           all R except a zero-element input laid      every rank holds the whole result
                                   out otherwise
R                                  every input R                               implied
=================================  ==========================================  ==============================================

Legacy empty inputs (shape ``(0,)``, and any 1-d input of a cat of higher-dim tensors) are
skipped by cat. Caps (documented, valid rows left out so the rows stay polynomial in the
number of inputs): subsets beyond "all" and "exactly one" only for up to ``MAX_SUBSET_INPUTS``
inputs in E(op); only the first ``MAX_FREE_INPUTS`` zero-element inputs get alternatives.
Not valid: the cat dim sharded with two non-empty inputs; P(sum) mixed with R (the
replicated operand would be summed n times); P(sum/avg) through a dtype change.

``slice_scatter(self, src, dim, start, end, step)`` — ``[out, self, src]`` (+ ``out=``);
``ops(src)`` = the reduce ops src's cast to self's dtype keeps:

=================================  ==========================================  ==============================================
out                                self, src                                   why it is valid
=================================  ==========================================  ==============================================
S(d), d != slice dim               S(d), S(d)                                  self and src have equal sizes on every d != dim,
                                                                               so rows line up; the slice is along another dim
P(op), op in ops(src)              P(op), P(op)                                linear in (self, src) jointly / a selection
P(avg) / P(max) / P(min)           P(op), R | R, P(op) (op in ops(src))        each output element is a copy of one element of
                                                                               self or src: mean/max/min of a replicated
                                                                               operand is itself
X in {R, P(op)}                    X, any of R/P(op') src's dtype allows       slice is EMPTY: out == self whatever src holds
X in {R, P(op in ops(src))}        any of R/P(op'), X                          slice is FULL (covers all of dim, step 1):
                                                                               out == cast(src) whatever self holds
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

Not valid in general: the slice dim of self sharded (each rank would apply the *global*
start/end/step to its local chunk); self and src on different dims; P(sum) with one
operand replicated (unless the slice is empty/full as above); a Partial src whose cast
to self's dtype breaks its reduction (:mod:`dtensor_rules.op_rules._casts`).

Symbolic sizes: emptiness, "full slice" and legacy-empty inputs are decided with
``guard_or_false`` (never a guard on an unbacked size); an unknown answer drops the rows
that need it (fewer strategies, never a wrong one).

Dispatch cost: both rules are ``op_strategy`` rules built by
:func:`dtensor_rules.dispatch.rows.rows_strategy`: dispatch prices at most two full-mesh
strategies (the cheapest row per mesh dim from the current layouts, and all-Replicate);
solvers and the validator, which pass several candidate layouts per input, get every row
over every mesh dim. On a mesh dim where no input is Partial(op) now, dispatch scores no
Partial(op) row (:func:`cat_dispatch_rows`, :func:`partial_rows_held_now`): such a row only
relabels Replicate inputs or asks for a move dispatch does not run, so it never beats
all-Replicate, and when the inputs must move the search priced every product of those rows.
Upstream torch 2.13: cat offers one follow-the-exemplar strategy per input layout with no
Partial max/min mixing and no cat-dim case; slice_scatter forces src to follow self, drops
tensor_meta on inputs and never lets Partial through.

Cost (family ``copy``: memory-bound, priced by the elements touched):

=================================  ==========================================  =========================  =================
op                                 bytes read                                  bytes written              flops
=================================  ==========================================  =========================  =================
cat(tensors, dim)                  every input                                 output (promoted dtype)    0
slice_scatter(self, src, ...)      self + src                                  self (copy) + src          0
=================================  ==========================================  =========================  =================

Samples: uneven sizes, legacy empty inputs, negative dims, clamped / negative / None bounds,
step > 1, empty and full slices, bf16 and int64.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch._ops import OpOverload
from torch.distributed.tensor.placement_types import Partial, Placement, Replicate
from torch.fx.experimental.symbolic_shapes import guard_or_false

from dtensor_rules._upstream import OpSchema, OpStrategy, ShardingPlaceholder
from dtensor_rules.costs._util import nbytes, numel
from dtensor_rules.costs.formulas import formula
from dtensor_rules.costs.op_cost import OpCost
from dtensor_rules.dispatch.greedy import flat_inputs, Key, key
from dtensor_rules.dispatch.rows import rows_strategy
from dtensor_rules.op_rules._casts import cast_partial_ops
from dtensor_rules.op_rules._common import generator, normalize_dim, PlacementOrHole, Samples
from dtensor_rules.op_rules._gaps import ALIASED_UNPRICED
from dtensor_rules.op_rules._partial import partial_ops
from dtensor_rules.registry import register

aten = torch.ops.aten
CAT = [aten.cat.default, aten.cat.out]
SLICE_SCATTER = [aten.slice_scatter.default, aten.slice_scatter.out]

Row = list[PlacementOrHole]

# cat: every subset of Partial(avg/max/min) inputs is a row only up to this many eligible
# inputs (7 rows per reduce op); beyond it "all" and "exactly one" (polynomial in inputs).
# Dispatch additionally scores the subset that is Partial right now.
MAX_SUBSET_INPUTS = 3
# zero-element inputs contribute nothing, so they may be laid out any way; rows are multiplied
# by the 1 + 4 choices of each, for at most this many of them
MAX_FREE_INPUTS = 2


# --------------------------------------------------------------------------- cost formula

@formula(family="copy")
def cat_cost(op: OpOverload, b: dict[str, Any]) -> OpCost:
    tensors = [t for t in b["tensors"] if not (t.dim() == 1 and t.shape[0] == 0)]  # legacy empty inputs are skipped
    if not tensors:
        return OpCost(0, 0, 0)
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    out = sum(numel(t) for t in tensors) * dtype.itemsize
    return OpCost(0, sum(nbytes(t) for t in tensors), out, dtype=dtype)


@formula(family="copy")
def slice_scatter_cost(op: OpOverload, b: dict[str, Any]) -> OpCost:
    self, src = b["self"], b["src"]
    isz = self.dtype.itemsize
    return OpCost(0, nbytes(self) + nbytes(src), (numel(self) + numel(src)) * isz, dtype=self.dtype)


# --------------------------------------------------------------------------- sample suites

def _rand(seed: int):  # noqa: ANN202 - tiny local factory
    g = generator(seed)

    def r(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        if dtype.is_floating_point:
            return torch.randn(*shape, generator=g).to(dtype)
        return torch.randint(-5, 6, shape, generator=g, dtype=dtype)

    return r


def cat_samples() -> Samples:
    r = _rand(10)
    return [
        (([r(4, 3), r(4, 5)], 1), {}),  # different sizes on the cat dim
        (([r(5, 3), r(2, 3), r(3, 3)], -2), {}),  # three inputs, negative dim, uneven
        (([r(3, 4), torch.zeros(0), r(3, 2)], -1), {}),  # legacy empty input is skipped
        (([r(0, 6), r(5, 6)], 0), {}),  # one input empty on the cat dim: the cat dim may shard
        (([r(2, 3, 5, dtype=torch.bfloat16), r(2, 1, 5, dtype=torch.bfloat16)], 1), {}),
        (([r(6, 2, dtype=torch.int64), r(6, 3, dtype=torch.int64)], 1), {}),
    ]


def slice_scatter_samples() -> Samples:
    r = _rand(11)
    return [
        ((r(4, 6), r(4, 2), 1, 1, 5, 2), {}),  # step 2
        ((r(5, 6), r(5, 3), -1, -3, None), {}),  # negative start, end None
        ((r(6, 3), r(6, 3), 0, -10, 100), {}),  # clamped bounds: full slice, out == src
        ((r(5, 6), r(5, 0), 1, 4, 2), {}),  # empty slice, out == self
        ((r(7, 4, dtype=torch.bfloat16), r(3, 4, dtype=torch.bfloat16), 0, 2, 5), {}),
        ((r(5, 4, dtype=torch.int64), r(5, 2, dtype=torch.int64), 1, 0, 4, 3), {}),
    ]


def _with_out(row: Row, has_out: bool) -> Row:
    """``.out`` variants: the ``out=`` tensor (last in pytree order) is laid out like the result."""
    return row + [row[0]] if has_out else row


def _known_zero(size: Any) -> bool:
    """True only if ``size`` is statically 0; an unbacked size is not assumed empty."""
    return guard_or_false(size == 0)


def _numel_known_zero(shape: Sequence[Any]) -> bool:
    return any(_known_zero(s) for s in shape)


# --------------------------------------------------------------------------- cat
class CatCall(NamedTuple):
    """What cat's rows depend on, read once from the input metas (hashable: rows are cached on it)."""

    dtypes: tuple[torch.dtype, ...]
    real: tuple[int, ...]  # inputs cat does not skip (not legacy-empty)
    empty: tuple[int, ...]  # inputs known to have no elements (an unknown size is not empty)
    empty_on_cat_dim: tuple[int, ...]  # real inputs known to be empty on the cat dim
    cat_dim: int
    ndim: int
    out_dtype: torch.dtype
    has_out: bool


def _cat_call(metas: list[Any], dim_arg: int, has_out: bool) -> CatCall | None:
    shapes = [m.shape for m in metas]
    ndim = max(len(s) for s in shapes)

    def legacy(s: Sequence[Any]) -> bool:
        # cat skips 1-d tensors with no elements; next to higher-dim inputs a 1-d one must be one
        return len(s) == 1 and (ndim > 1 or _known_zero(s[0]))

    real = tuple(i for i, s in enumerate(shapes) if not legacy(s))
    if not real:
        return None
    cat_dim = normalize_dim(dim_arg, ndim)
    dtypes = tuple(m.dtype for m in metas)
    out_dtype = dtypes[0]
    for d in dtypes[1:]:
        out_dtype = torch.promote_types(out_dtype, d)
    return CatCall(
        dtypes,
        real,
        tuple(i for i, s in enumerate(shapes) if _numel_known_zero(s)),
        tuple(i for i in real if _known_zero(shapes[i][cat_dim])),
        cat_dim,
        ndim,
        out_dtype,
        has_out,
    )


@functools.lru_cache(maxsize=512)
def cat_rows(call: CatCall, *, subsets: bool = True, free: bool = True) -> tuple[Row, ...]:
    """cat's single-dim rows (the module table). ``subsets``/``free``: emit the subset and
    zero-element-input variants (dispatch scores without them: see :func:`cat_dispatch_rows`).
    Cached on the call's facts (a pure function of them); do not mutate the rows."""
    n, R = len(call.dtypes), Replicate()

    def row(out: PlacementOrHole, per_input: dict[int, PlacementOrHole]) -> Row:
        return _with_out([out] + [per_input.get(i, R) for i in range(n)], call.has_out)

    strategies: list[Row] = []
    for d in range(call.ndim):
        if d == call.cat_dim:
            non_empty = [i for i in call.real if i not in call.empty_on_cat_dim]
            if len(non_empty) > 1:
                continue
        S = ShardingPlaceholder(d)
        strategies.append(row(S, {i: S for i in call.real}))
    filled = _filled(call)
    replicated_rows = [row(R, {})]
    for reduce_op in partial_ops([call.out_dtype]):
        P = Partial(reduce_op)
        eligible = _eligible(call, reduce_op)
        if reduce_op == "sum":
            if len(eligible) == len(filled):
                strategies.append(row(P, {i: P for i in call.real}))
            continue
        replicated_rows.append(row(P, {}))
        for subset in _subsets(eligible, subsets):
            strategies.append(row(P, {i: P for i in subset}))
    if free:
        strategies += _free_empty_inputs(strategies + replicated_rows, call)
    return tuple(strategies)


def _filled(call: CatCall) -> list[int]:
    """Inputs that may hold elements (an unknown size counts: its cast must keep the op)."""
    return [i for i in call.real if i not in call.empty]


@functools.lru_cache(maxsize=1024)  # asked per mesh dim and reduce op at every dispatch; CatCall is hashable
def _eligible(call: CatCall, reduce_op: str) -> tuple[int, ...]:
    return tuple(i for i in _filled(call) if reduce_op in cast_partial_ops(call.dtypes[i], call.out_dtype))


def _subsets(eligible: Sequence[int], all_subsets: bool) -> list[tuple[int, ...]]:
    """Every non-empty subset for few inputs; otherwise all of them and each one alone."""
    if all_subsets and len(eligible) <= MAX_SUBSET_INPUTS:
        return [s for k in range(1, len(eligible) + 1) for s in itertools.combinations(eligible, k)]
    out = [tuple(eligible)] if eligible else []
    return out + [(i,) for i in eligible if len(eligible) > 1]


def _free_empty_inputs(rows: list[Row], call: CatCall) -> list[Row]:
    """A zero-element input adds nothing to the result, so any Replicate / Partial layout of it
    (its local piece is empty too) gives the same output: offer each, for up to MAX_FREE_INPUTS.

    A legacy ``(0,)`` input is skipped by cat whatever the row; any other empty input must still
    match the others' local sizes off the cat dim, so it is freed only in rows that shard no
    other dim. Returns only the new rows (``rows`` with a free input changed).
    """
    out = list(rows)
    for i in call.empty[:MAX_FREE_INPUTS]:
        choices: list[PlacementOrHole] = [Replicate()] + [Partial(o) for o in partial_ops([call.dtypes[i]])]
        legacy = i not in call.real
        out = [
            r[: 1 + i] + [c] + r[2 + i :]
            for r in out
            for c in choices
            if key(c) != key(r[1 + i])
            and (legacy or not any(isinstance(p, ShardingPlaceholder) and p.dim != call.cat_dim for p in r))
        ] + out
    seen = {tuple(map(key, r)) for r in rows}
    return [r for r in out if tuple(map(key, r)) not in seen]


@functools.lru_cache(maxsize=1024)  # asked per mesh dim by the greedy and again by the search; do not mutate
def cat_dispatch_rows(call: CatCall, current: tuple[Key, ...]) -> tuple[Row, ...]:
    """Rows dispatch scores on one mesh dim, given the inputs' placements there now: the Shard
    rows, and per reduce op at most ONE Partial row, the one that keeps every input that is
    Partial(op) now as it is.

    Any other Partial(op) row is never cheaper: it either puts a Partial(op) input back to
    Replicate (an all-reduce), or asks a Shard / other-Partial input for Partial(op) (a move
    dispatch does not run), or only relabels a Replicate input as Partial(op) (a local no-op,
    priced 0, the same cost as leaving it Replicate). So with no input Partial(op) now there is
    no Partial(op) row (all-Replicate costs the same and is scored first), unless an ``out=``
    tensor that is Partial(op) must be written. Every variant would give dispatch's search ~7
    rows per reduce op and mesh dim to price for a cat whose inputs must move (6 inputs: 24 rows
    per mesh dim, a coordinate descent instead of a small exhaustive search).
    """
    n, R = len(call.dtypes), Replicate()
    rows = [r for r in cat_rows(call, subsets=False, free=False) if not isinstance(r[0], Partial)]
    out_now = current[-1] if call.has_out else None
    for reduce_op in partial_ops([call.out_dtype]):
        P = Partial(reduce_op)
        if reduce_op == "sum":
            if len(_eligible(call, "sum")) == len(_filled(call)) and (
                    out_now == ("P", "sum") or any(current[i] == ("P", "sum") for i in call.real)):
                rows.append(_with_out([P] + [P if i in call.real else R for i in range(n)], call.has_out))
            continue
        eligible = _eligible(call, reduce_op)
        now = [i for i in eligible if current[i] == ("P", reduce_op)]
        if not now and out_now == ("P", reduce_op):
            now = list(eligible)  # the out= tensor is Partial(op): every eligible input relabelled, no move
        if now:
            rows.append(_with_out([P] + [P if i in now else R for i in range(n)], call.has_out))
    return tuple(rows)


def _cat_args(op_schema: OpSchema) -> tuple[list[Any], int]:
    args, kwargs = op_schema.args_meta, op_schema.kwargs_meta
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    return list(args[0]), dim


@register(aten.cat.default, kind="op_strategy", cost=cat_cost, samples=cat_samples)
@register(aten.cat.out, kind="op_strategy", gaps=ALIASED_UNPRICED)
def cat_strategy(op_schema: OpSchema, full: bool = False) -> OpStrategy:
    """Non-cat dims shard together; Partial passes where the dtype cast keeps it; the cat dim only
    if one input is non-empty; zero-element inputs are free."""
    metas, dim = _cat_args(op_schema)
    has_out = "out" in op_schema.kwargs_schema
    call = _cat_call(metas, dim, has_out)
    n_in = len(flat_inputs(op_schema))
    out_input = n_in - 1 if has_out else None
    if call is None:  # every input is a legacy empty tensor: only all-Replicate
        return rows_strategy(op_schema, lambda: [], lambda cur: [], out_input=out_input, full=full)
    return rows_strategy(
        op_schema, lambda: list(cat_rows(call)), lambda cur: cat_dispatch_rows(call, tuple(cur)), out_input=out_input,
        full=full,
    )


# --------------------------------------------------------------------------- slice_scatter
class SliceFacts(NamedTuple):
    """What the rows need to know about ``x[start:end:step]`` along a dim (False = unknown)."""

    empty: bool
    full: bool
    shard_empty: bool  # empty AND still empty on every shorter local shard


def _is_int(x: Any) -> bool:
    return x is None or isinstance(x, int)


def slice_length(size: int, start: int | None, end: int | None, step: int) -> tuple[int, int]:
    """(first index, number of elements) of ``x[start:end:step]`` along a dim of ``size``.

    torch clamps out-of-range bounds exactly like Python slicing (step must be positive).
    """
    if step <= 0:
        raise ValueError(f"slice step must be positive, got {step}")
    lo, hi, st = slice(start, end, step).indices(size)
    return lo, len(range(lo, hi, st))


def slice_facts(size: Any, start: Any, end: Any, step: Any) -> SliceFacts:
    """Exact for plain ints; with symbolic sizes or bounds only what is statically known."""
    if all(_is_int(x) for x in (size, start, end, step)):
        first, length = slice_length(size, start, end, step)
        empty = length == 0
        mixed = start is not None and start < 0 and (end is None or end >= 0)
        return SliceFacts(empty, length == size and step == 1 and first == 0, empty and not mixed)
    full = (
        guard_or_false(step == 1)
        and (start is None or guard_or_false(start == 0) or guard_or_false(start <= -size))
        and (end is None or guard_or_false(end >= size))
    )
    empty = (
        guard_or_false(size == 0)
        or (start is not None and guard_or_false(start >= size))
        or (end is not None and guard_or_false(end <= -size))
        or (end is not None and guard_or_false(end == 0))
    )
    return SliceFacts(empty, full, False)


class ScatterCall(NamedTuple):
    ndim: int
    dim: int
    facts: SliceFacts
    self_ops: tuple[str, ...]  # Partial ops self (and the output) can carry
    src_ops: tuple[str, ...]  # Partial ops src can carry through its cast to self's dtype
    src_any: tuple[str, ...]  # Partial ops src's dtype allows (src unused: no cast matters)
    has_out: bool


def _scatter_call(op_schema: OpSchema) -> ScatterCall:
    args, kw = op_schema.args_meta, op_schema.kwargs_meta
    self_m, src_m = args[0], args[1] if len(args) > 1 else kw["src"]
    names, defaults = ("dim", "start", "end", "step"), (0, None, None, 1)
    dim, start, end, step = (
        args[2 + i] if len(args) > 2 + i else kw.get(name, default) for i, (name, default) in enumerate(zip(names, defaults))
    )
    ndim = len(self_m.shape)
    dim = normalize_dim(dim, ndim)
    size = self_m.shape[dim] if ndim else 1
    return ScatterCall(
        ndim, dim, slice_facts(size, start, end, step),
        partial_ops([self_m.dtype]), cast_partial_ops(src_m.dtype, self_m.dtype), partial_ops([src_m.dtype]),
        "out" in op_schema.kwargs_schema,
    )


@functools.lru_cache(maxsize=512)
def slice_scatter_rows(call: ScatterCall) -> tuple[Row, ...]:
    """slice_scatter's single-dim rows (the module table), cached on the call's facts."""

    def row(out: PlacementOrHole, s: PlacementOrHole, src: PlacementOrHole) -> Row:
        return _with_out([out, s, src], call.has_out)

    empty, full = call.facts.empty, call.facts.full
    strategies: list[Row] = []
    for d in range(call.ndim):
        if d != call.dim or full:
            S = ShardingPlaceholder(d)
            strategies.append(row(S, S, S))
    R: Placement = Replicate()
    for reduce_op in call.self_ops:
        P = Partial(reduce_op)
        if reduce_op in call.src_ops:
            strategies.append(row(P, P, P))
        if reduce_op != "sum":
            strategies.append(row(P, P, R))
            if reduce_op in call.src_ops:
                strategies.append(row(P, R, P))
    # an empty slice leaves self untouched (src may be laid out any way); a full slice
    # returns cast(src) (self may be laid out any way): the ignored operand is free
    self_kept = [R] + [Partial(o) for o in call.self_ops]
    src_ignored = [R] + [Partial(o) for o in call.src_any]
    src_passed = [R] + [Partial(o) for o in call.src_ops]
    # a replicated passed operand gives every rank the whole result: any mean/max/min of it is itself
    spread = [Partial(o) for o in call.self_ops if o != "sum"]

    def one_operand_passes(passed_opts: list[Placement], ignored_opts: list[Placement], place: Any) -> list[Row]:
        """out == the passed operand; ``place(out, passed, ignored)`` orders the row."""
        rows = []
        for passed in passed_opts:
            for ignored in ignored_opts:
                if passed != ignored:
                    rows.append(place(passed, passed, ignored))
                    if passed == R:
                        rows += [place(p, R, ignored) for p in spread]
        return rows

    if empty:
        strategies += one_operand_passes(self_kept, src_ignored, lambda o, kept, free: row(o, kept, free))
    if full:
        strategies += one_operand_passes(src_passed, self_kept, lambda o, kept, free: row(o, free, kept))
    if call.facts.shard_empty and call.ndim:
        # the local slice of an empty global slice is empty too (start >= end survives clamping to
        # a shorter shard), so self may be split on the slice dim; src has no elements to place.
        # Not with a negative start and non-negative end: [-2:3] is empty on 6 rows, not on 3.
        S = ShardingPlaceholder(call.dim)
        strategies += [row(S, S, ignored) for ignored in src_ignored]
    return tuple(strategies)


@register(aten.slice_scatter.default, kind="op_strategy", cost=slice_scatter_cost, samples=slice_scatter_samples)
@register(aten.slice_scatter.out, kind="op_strategy", gaps=ALIASED_UNPRICED)
def slice_scatter_strategy(op_schema: OpSchema, full: bool = False) -> OpStrategy:
    """Shard dims other than the slice dim together; Partial passes where src's cast keeps it."""
    call = _scatter_call(op_schema)
    rows = slice_scatter_rows(call)
    out_input = 2 if call.has_out else None
    return rows_strategy(op_schema, lambda: list(rows), lambda cur: partial_rows_held_now(rows, cur), out_input=out_input,
                         full=full)


def partial_rows_held_now(rows: Sequence[Row], current: Sequence[Key]) -> list[Row]:
    """``rows`` without the Partial(op) rows when no input (nor an ``out=`` tensor) is Partial(op)
    on this mesh dim now: what dispatch scores.

    Such a row can only take its Partial(op) inputs from Replicate ones (a relabel, priced 0, the
    same as leaving them Replicate) or from Shard / other-Partial ones (a move dispatch does not
    run), so it never costs less than all-Replicate, which is scored first; it would only give
    dispatch's search more products to price (slice_scatter that moves on 8x8x8: 10 Partial rows
    per mesh dim)."""
    held = {k[1] for k in current if k[0] == "P"}
    return [r for r in rows if not isinstance(r[0], Partial) or r[0].reduce_op in held]


# solvers' cost tables (dtensor_rules.costs.strategy_costs) price every strategy, not dispatch's two
for _fn in (cat_strategy, slice_scatter_strategy):
    _fn.full_enumeration = functools.partial(_fn, full=True)  # type: ignore[attr-defined]


def clear_row_caches() -> None:
    """Forget the memoised rows (benchmarks measure cold propagation with this)."""
    for memo in (cat_rows, cat_dispatch_rows, slice_scatter_rows, _eligible):
        memo.cache_clear()

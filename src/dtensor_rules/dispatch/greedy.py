"""Dispatch's strategy from single-dim rows in O(mesh dims x rows x inputs), not rows ** mesh dims.

At dispatch every input holds ONE spec (its current layout), so the cheapest valid strategy
is mostly the one that moves nothing. Per mesh dim, each row is scored from the inputs'
current placements there (:func:`transition_weight` x the input's bytes) and the cheapest row
is kept (greedy over mesh dims, never mixing Partial kinds on one tensor). If that choice moves
an input, a search by DTensor's real redistribute cost improves it (:func:`_search`). Two
full-mesh strategies are returned: that one and all-Replicate (always valid). Both are products of valid single-dim rows, so validity is the
rule's table; the score only decides which valid strategy dispatch prices. It is a heuristic:
it may redistribute where a full search finds a cheaper valid strategy, never to an invalid one.

:func:`dispatch_inputs` says when this applies: every input has one spec in Shard / Replicate /
Partial placements with the default shard order. Otherwise (a solver's candidate layouts,
``_StridedShard``, ``_MaskPartial``, a non-default device order) callers use the full expansion.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from torch.distributed.tensor.placement_types import Partial, Replicate, Shard

from dtensor_rules._upstream import (
    DTensorSpec,
    OpSchema,
    OpSpec,
    OpStrategy,
    ShardingPlaceholder,
    TupleStrategy,
    enabled_local_tensor_mode,
    is_tensor_shardable,
    redistribute_cost,
)
from dtensor_rules.kernels.grouped_mm_checks import chunk_sizes  # torch.chunk's local sizes

Row = list[Any]  # one mesh dim: [*output placements, *input placements] (placeholders allowed)
Key = tuple[Any, ...]
INF = float("inf")
# an unknown (symbolic) size is priced as this many elements: any positive guess keeps the
# order of transitions; the real redistribute costs of the two finalists decide
_UNKNOWN_ELEMS = 1 << 20
_PLAIN = (Shard, Replicate, Partial)


class Input(NamedTuple):
    """One flattened tensor input of the call at dispatch: its strategy and current layout."""

    strategy: OpStrategy
    current: DTensorSpec
    nbytes: float
    integral: bool  # an integer / bool dtype
    shape: tuple[int, ...] | None = None  # None when a size is symbolic


class ExactIntegerPartial:
    """Whether Replicate -> Partial(sum) is exact for integer tensors right now (the
    ``exact_int_partition`` patch of :mod:`dtensor_rules.op_rules._partial` switches it); upstream's
    own partition divides by the mesh size and returns floats."""

    active = False


def flat_inputs(op_schema: OpSchema) -> list[OpStrategy]:
    """Tensor inputs in pytree order (list elements and kwargs included), as dispatch counts them."""
    out: list[OpStrategy] = []

    def walk(x: Any) -> None:
        if isinstance(x, OpStrategy):
            out.append(x)
        elif isinstance(x, TupleStrategy):
            for c in x.children:
                walk(c)
        elif isinstance(x, (list, tuple)):
            for c in x:
                walk(c)

    for a in op_schema.args_schema:
        walk(a)
    for v in op_schema.kwargs_schema.values():
        walk(v)
    return out


def key(p: Any) -> Key:
    """A cheap comparable stand-in for a placement (``Placement.__eq__`` costs ~14 us in 2.13).

    Placeholders key as the plain Shard they become; subclasses (``_StridedShard``,
    ``_MaskPartial``) never equal a row's placement.
    """
    t = type(p)
    if t is Replicate:
        return ("R",)
    if t is Shard or t is ShardingPlaceholder:
        return ("S", p.dim)
    if t is Partial:
        return ("P", p.reduce_op)
    if isinstance(p, Partial):  # e.g. a masked gather's output: reduces like Partial(reduce_op), never equals it
        return ("PM", p.reduce_op, t.__name__, repr(p))
    return (t.__name__, repr(p))


def transition_weight(src: Key, dst: Key, integral: bool) -> float:
    """Relative collective volume of one input's change on one mesh dim (0 = no change).

    R -> S / P is a local op (tiny weight, so an unchanged layout wins ties); S -> R, S -> S',
    P -> S cost one all-gather / all-to-all / reduce-scatter of the input; P -> R an
    all-reduce (twice that). Infinite (never chosen) for what DTensor's dispatch does not run:
    S -> P and P -> P' (its ``redistribute_cost`` is infinite on 2.13 and 2.14; 2.13 cannot
    run them at all, 2.14 only S -> P(sum) by explicit ``redistribute``), and R -> P(sum) of an
    integer tensor unless the partition is exact (:class:`ExactIntegerPartial`).
    """
    if src == dst:
        return 0.0
    if dst[0] in ("P", "PM"):
        if src[0] != "R" or (integral and dst[1] == "sum" and not ExactIntegerPartial.active):
            return INF
        return 1e-3
    if src[0] == "R":
        return 1e-3
    if src[0] == "P":
        return 1.0 if dst[0] == "S" else 2.0
    return 1.0  # a shard: gather (then a local op) or all-to-all


def fill(p: Any) -> Any:
    """A row's placement as a real one (placeholders become plain Shard)."""
    return Shard(p.dim) if isinstance(p, ShardingPlaceholder) else p


def mixes_partials(keys: Sequence[Key]) -> bool:
    """One tensor Partial over different reduce ops on different mesh dims (sum with avg is fine)."""
    ops = {k[1] for k in keys if k[0] in ("P", "PM")}
    return len(ops) > 1 and ops != {"sum", "avg"}


def _static_bytes(meta: Any) -> float:
    n = 1
    for s in meta.shape:
        n *= s if isinstance(s, int) else _UNKNOWN_ELEMS
    return float(n * meta.dtype.itemsize)


def _plain(spec: DTensorSpec) -> bool:
    """Shard / Replicate / Partial only, in the default shard order (which can only differ when
    one tensor dim is sharded over several mesh dims: then compare, the rare slow case)."""
    sharded: set[int] = set()
    repeated = False
    for p in spec.placements:
        t = type(p)
        if t not in _PLAIN:
            return False
        if t is Shard:
            repeated |= p.dim in sharded
            sharded.add(p.dim)
    if not repeated:
        return True
    order = getattr(spec, "shard_order", None)
    return order is None or order == DTensorSpec(spec.mesh, spec.placements).shard_order


def dispatch_inputs(strategies: Sequence[OpStrategy]) -> list[Input] | None:
    """The inputs as dispatch holds them, or None if this is not a plain dispatch query (see module doc)."""
    inputs = []
    for s in strategies:
        if len(s.strategies) != 1:
            return None
        spec = s.strategies[0].output_spec
        if not _plain(spec) or spec.tensor_meta is None:
            return None
        meta = spec.tensor_meta
        dtype = meta.dtype
        shape = tuple(meta.shape) if all(type(n) is int for n in meta.shape) else None
        inputs.append(Input(s, spec, _static_bytes(meta), not (dtype.is_floating_point or dtype.is_complex), shape))
    return inputs


def greedy_rows(
    inputs: Sequence[Input],
    ndim: int,
    dispatch_rows: Callable[[Sequence[Key]], Sequence[Row]],
    n_out: int,
    fixed: Mapping[int, int],
    mesh_sizes: Sequence[int] | None = None,
    order: Sequence[int] | None = None,
) -> list[Row] | None:
    """Per mesh dim the cheapest row from the current placements, keeping Partial kinds unmixed.

    ``fixed`` maps an input that is written into (``out=``, in-place self) to its output: its
    row placement must equal its current one and the output's. With ``mesh_sizes``, a row is
    skipped where it would make a collective produce empty shards of an input of static shape
    (:func:`collective_shards_fit`), so the next best row is taken there instead of the whole
    strategy falling back to all-Replicate later. ``order``: the mesh dims in the order rows are
    picked (default 0, 1, ...); the result is still one row per mesh dim in mesh-dim order.

    The first row of least finite cost wins (all-Replicate, then the rule's order); None if a mesh
    dim has no row DTensor can move the inputs to. A row's score stops
    accumulating once it cannot beat the best so far, and a mesh dim stops at a row that moves
    nothing (no later row can be cheaper), so dispatch rarely scores every row of every input.
    """
    picked: dict[int, Row] = {}
    replicate: Row = [Replicate()] * (n_out + len(inputs))
    # per row (often the same cached objects on every mesh dim): its input keys and Partial columns
    facts_of: dict[int, tuple[list[Key], list[Key], tuple[tuple[int, Any], ...]]] = {}
    partial_ops_of: dict[int, set[Any]] = {}  # column -> reduce ops the picked rows put there
    nbytes = [i.nbytes for i in inputs]
    integral = [i.integral for i in inputs]
    n_in = len(inputs)
    # per input: its placement keys on the mesh dims picked so far, before and after (empty-shard check)
    track = [i for i in range(n_in) if inputs[i].shape is not None] if mesh_sizes is not None else []
    was: list[list[Key]] = [[] for _ in range(n_in)]
    goes: list[list[Key]] = [[] for _ in range(n_in)]
    sizes: list[int] = []
    for m in range(ndim) if order is None else order:
        current = [key(i.current.placements[m]) for i in inputs]
        best, best_cost, best_partials = None, INF, ()
        for row in _candidates(replicate, dispatch_rows, current):
            facts = facts_of.get(id(row))
            if facts is None:
                keys = [key(p) for p in row]
                facts = facts_of[id(row)] = (keys, keys[n_out:], tuple((j, k[1]) for j, k in enumerate(keys) if k[0] in ("P", "PM")))
            keys, targets, partials = facts
            if fixed and any(targets[i] != current[i] or keys[o] != current[i] for i, o in fixed.items()):
                continue
            cost = 0.0
            for i in range(n_in):
                if targets[i] != current[i]:
                    cost += transition_weight(current[i], targets[i], integral[i]) * nbytes[i]
                    if best is not None and cost >= best_cost:
                        break
            if not cost < best_cost:
                continue  # (an infinite cost never wins: a move DTensor does not run)
            if partial_ops_of and any(_mixes(partial_ops_of.get(j), op) for j, op in partials):
                continue
            if track and not all(
                collective_shards_fit(inputs[i].shape, [*was[i], current[i]], [*goes[i], targets[i]], [*sizes, mesh_sizes[m]])  # type: ignore[arg-type,index]
                for i in track
                if targets[i][0] == "S"
            ):
                continue
            best, best_cost, best_partials = row, cost, partials
            if cost == 0.0:
                break  # no row is cheaper than moving nothing (the first such row wins)
        if best is None:
            return None
        picked[m] = best
        if track:
            sizes.append(mesh_sizes[m])  # type: ignore[index]
        for i in track:
            was[i].append(current[i])
            goes[i].append(facts_of[id(best)][1][i])
        for j, op in best_partials:
            partial_ops_of.setdefault(j, set()).add(op)
    return [picked[m] for m in range(ndim)]


def collective_shards_fit(shape: Sequence[int], src: Sequence[Key], dst: Sequence[Key], mesh_sizes: Sequence[int]) -> bool:
    """Whether the move of a tensor of static ``shape`` from placements ``src`` to ``dst`` (keys,
    one per mesh dim) can run where it runs: False only for a reduce-scatter the simulated mesh
    cannot run.

    A reduce-scatter (``P -> S(d)`` on mesh dim m) cuts each rank's local piece of dim d with
    ``torch.chunk``. On real ranks every rank does that on its own; under ``LocalTensorMode``
    (the simulated mesh) one op runs for all ranks, and where the ranks' local sizes of d (cut
    unevenly by the mesh dims that shard d before m) give different numbers of chunks — 3 rows as
    2 / 1 chunked in 2: 2 chunks vs 1 — LocalTensor cannot combine the per-rank results and
    dispatch fails ("'NoneType' object has no attribute 'requires_grad'", torch 2.13 and 2.14;
    upstream's own strategies fail there too). Every other uneven or empty layout runs (upstream
    2.13's ``cat``/``scatter``/``softmax`` strategies choose them), and on a real mesh this one
    does too, so only that move on the simulated mesh is refused (refusing every reduce-scatter
    into empty shards would move more bytes than upstream's choice).
    """
    if enabled_local_tensor_mode() is None:
        return True
    for m, (s, d) in enumerate(zip(src, dst)):
        if s[0] != "P" or d[0] != "S":
            continue
        dim = d[1]
        pieces = {shape[dim]}  # the distinct local sizes of d on the ranks
        for k in range(m):  # mesh dims that cut d before m does (DTensor's default shard order)
            if dst[k] == ("S", dim):
                pieces = {n for p in pieces for n in chunk_sizes(p, mesh_sizes[k])}
        if len({_chunk_count(n, mesh_sizes[m]) for n in pieces}) > 1:
            return False
    return True


def _chunk_count(n: int, k: int) -> int:
    """How many tensors ``torch.chunk`` returns for n rows in k chunks (k for an empty dim)."""
    return k if n == 0 else -(-n // -(-n // k))


def _candidates(replicate: Row, dispatch_rows: Callable[[Sequence[Key]], Sequence[Row]], current: list[Key]) -> Iterator[Row]:
    """All-Replicate, then the rule's rows: asked for only if all-Replicate moves something."""
    yield replicate
    yield from dispatch_rows(current)


def _mixes(ops: set[Any] | None, op: Any) -> bool:
    """Adding Partial(``op``) to a column already Partial over ``ops`` mixes reduce ops (see
    :func:`mixes_partials`)."""
    if not ops or op in ops and len(ops) == 1:
        return False
    both = ops | {op}
    return len(both) > 1 and both != {"sum", "avg"}


def priced_strategy(
    mesh: Any,
    inputs: Sequence[Input],
    per_dim: Sequence[Row],
    n_out: int,
    fixed: Mapping[int, int],
    allow_uneven_sharding: bool = True,
    memo: dict[Any, Any] | None = None,
) -> OpSpec | None:
    """The full-mesh strategy taking row ``per_dim[m]`` on mesh dim m, priced; None if unusable.

    Shardability as upstream's expansion judges it, except that a size DTensor cannot decide
    (unbacked) counts as not shardable instead of guarding; an unchanged input keeps its
    layout when the rule allows uneven shards.
    """
    memo = {} if memo is None else memo
    width = n_out + len(inputs)
    followed: set[tuple[int, int, tuple[int, ...]]] | None = None  # worked out when an input moves
    cols = [tuple(fill(r[j]) for r in per_dim) for j in range(width)]
    if any(mixes_partials([key(p) for p in c]) for c in cols):
        return None
    targets = []
    costs = []
    for idx, (i, pl) in enumerate(zip(inputs, cols[n_out:])):
        current_keys = tuple(map(key, i.current.placements))
        target_keys = tuple(map(key, pl))
        unchanged = target_keys == current_keys
        if idx in fixed and not unchanged:
            return None
        if unchanged:  # its own layout: no move, cost 0 (shardable unless the rule wants even shards)
            spec = i.current
            ok = allow_uneven_sharding or is_tensor_shardable(i.current.tensor_meta.shape, spec, allow_unbacked_sharding=False)
            cost = 0.0
        else:
            if followed is None:
                followed = held_shardings(inputs)
            fits = None if not allow_uneven_sharding or i.shape is None else (
                follows_held(i.shape, target_keys, mesh.shape, followed)
                and collective_shards_fit(i.shape, current_keys, target_keys, mesh.shape)
            )
            spec, ok, cost = _memo_move(memo, mesh, i.current, current_keys, pl, target_keys, fits)
        if not ok:
            return None
        targets.append(spec)
        costs.append([cost])
    outs = [None if all(p is None for p in c) else DTensorSpec(mesh, c) for c in cols[:n_out]]
    if any(o is None for o in outs[:1]) and n_out == 1:
        return None
    return OpSpec(output_specs=outs[0] if n_out == 1 else tuple(outs), input_specs=targets, redistribute_cost=costs)


class Pricer:
    """DTensor's redistribute cost of many candidate strategies of ONE dispatch call, without
    building their specs (the search prices up to 1024 products; building a full ``DTensorSpec`` /
    ``OpSpec`` for each made a moving scatter_add on 8x8x8 cost 11x upstream's propagation).

    :meth:`cost` applies exactly :func:`priced_strategy`'s usability tests and sums the same
    per-input costs in the same order, so the cheapest product is the same one; each input's move
    to a target layout is worked out once (``memo``, shared with :func:`priced_strategy`, which
    builds the winner's spec). Row keys are cached per row object."""

    def __init__(self, mesh: Any, inputs: Sequence[Input], n_out: int, fixed: Mapping[int, int],
                 allow_uneven_sharding: bool, memo: dict[Any, Any]) -> None:
        self.mesh, self.inputs, self.n_out, self.fixed = mesh, inputs, n_out, fixed
        self.allow_uneven_sharding, self.memo = allow_uneven_sharding, memo
        self.mesh_shape = tuple(mesh.shape)
        self.held = held_shardings(inputs)
        self.current = [tuple(map(key, i.current.placements)) for i in inputs]
        self._row_facts: dict[int, _RowFacts] = {}  # id(row) -> its facts (the row kept alive)
        self._moves: dict[tuple[int, Key], tuple[bool, float]] = {}  # (input, target keys) -> (usable, cost)

    def _facts(self, row: Row) -> _RowFacts:
        got = self._row_facts.get(id(row))
        if got is None:
            keys = [key(fill(p)) for p in row]
            got = self._row_facts[id(row)] = _RowFacts(
                row, keys, all(k[0] in ("R", "S", "P") for k in keys[self.n_out:]),
                tuple((j, k[1]) for j, k in enumerate(keys) if k[0] in ("P", "PM")))
        return got

    def _move(self, idx: int, target: Key) -> tuple[bool, float]:
        got = self._moves.get((idx, target))
        if got is not None:
            return got
        i, current = self.inputs[idx], self.current[idx]
        if target == current:
            ok = self.allow_uneven_sharding or is_tensor_shardable(
                i.current.tensor_meta.shape, i.current, allow_unbacked_sharding=False)
            got = (ok, 0.0)
        else:
            fits = None if not self.allow_uneven_sharding or i.shape is None else (
                follows_held(i.shape, target, self.mesh_shape, self.held)
                and collective_shards_fit(i.shape, current, target, self.mesh_shape)
            )
            pl = tuple(fill(self._placement(target, m)) for m in range(len(target)))
            _, ok, cost = _memo_move(self.memo, self.mesh, i.current, current, pl, target, fits)
            got = (ok, cost)
        self._moves[(idx, target)] = got
        return got

    @staticmethod
    def _placement(keys: Key, m: int) -> Any:
        k = keys[m]
        if k[0] == "R":
            return Replicate()
        if k[0] == "S":
            return Shard(k[1])
        if k[0] == "P":
            return Partial(k[1])
        raise KeyError(k)  # (never: the cost of a row with another placement goes through priced_strategy)

    def cost(self, per_dim: Sequence[Row], bound: float = INF) -> float | None:
        """:func:`priced_strategy`'s total cost of ``per_dim`` (plain rows), or None where it
        returns None. With ``bound``: None as soon as the partial sum reaches it (every cost is
        >= 0, so such a product cannot be cheaper than ``bound``; its later moves are never priced)."""
        facts = [self._facts(r) for r in per_dim]
        n_out = self.n_out
        if sum(len(f.partials) for f in facts) > 1:  # a column Partial on several mesh dims: kinds must not mix
            for j in {j for f in facts for j, _ in f.partials}:
                if mixes_partials([f.keys[j] for f in facts]):
                    return None
        total = 0.0
        for idx in range(len(self.inputs)):
            target = tuple(f.keys[n_out + idx] for f in facts)
            if idx in self.fixed and target != self.current[idx]:
                return None
            ok, c = self._move(idx, target)
            if not ok:
                return None
            total += c
            if total >= bound:
                return None
        if n_out == 1 and all(r[0] is None for r in per_dim):
            return None
        return total

    def plain(self, per_dim: Sequence[Row]) -> bool:
        """Whether every input placement of ``per_dim`` is plain (else price it with the full spec)."""
        return all(self._facts(r).plain for r in per_dim)


class _RowFacts(NamedTuple):
    row: Row  # kept alive so its id stays its own
    keys: list[Key]
    plain: bool  # every input placement Shard / Replicate / Partial
    partials: tuple[tuple[int, Any], ...]  # (column, reduce op) of its Partial placements


def held_shardings(inputs: Sequence[Input]) -> set[tuple[int, int, tuple[int, ...]]]:
    """(tensor rank, tensor dim, mesh dims sharding it) for every sharded dim of every input's
    current layout: the shardings dispatch may follow even where a dim is smaller than its shard
    count (:func:`follows_held`)."""
    held = set()
    for i in inputs:
        keys = [key(p) for p in i.current.placements]
        ndim = len(i.current.tensor_meta.shape)
        for d in {k[1] for k in keys if k[0] == "S"}:
            held.add((ndim, d, tuple(m for m, k in enumerate(keys) if k == ("S", d))))
    return held


def follows_held(
    shape: Sequence[int], target: Sequence[Key], mesh_sizes: Sequence[int], held: set[tuple[int, int, tuple[int, ...]]]
) -> bool:
    """Whether every dim of ``shape`` that ``target`` shards into more pieces than it has rows is
    sharded over exactly the mesh dims some input's current layout shards that dim over.

    Upstream's own strategies (softmax backward, cat, scatter) follow an input's layout dim by dim
    without a shardability test: g (R, R) and y (S(0), S(1)) of a 1x1 tensor go to (R, S(1)).
    Following a held sharding is what they do; making a new one of a too-small dim is refused
    (it only looks cheaper to the cost model, and a later view of that dim fails)."""
    count: dict[int, int] = {}
    over: dict[int, list[int]] = {}
    for m, k in enumerate(target):
        if k[0] == "S":
            count[k[1]] = count.get(k[1], 1) * mesh_sizes[m]
            over.setdefault(k[1], []).append(m)
    return all(n <= shape[d] or (len(shape), d, tuple(over[d])) in held for d, n in count.items())


def _memo_move(
    memo: dict[Any, Any], mesh: Any, src: DTensorSpec, src_keys: Key, pl: tuple[Any, ...], dst_keys: Key,
    fits: bool | None = None,
) -> tuple[DTensorSpec, bool, float]:
    """An input's move to placements ``pl``: (target spec, usable, redistribute cost), worked
    out once per distinct (source layout, tensor meta, target layout) and shared — a cat of 8
    alike shards builds one target spec and plans one redistribution. A symbolic (unhashable)
    shape is worked out each time.

    Usable: upstream's ``is_tensor_shardable`` (never guarding on a symbolic size), or ``fits``:
    for a static shape under a rule that allows uneven shards, every too-small dim of the target
    is sharded as some input's current layout shards it (:func:`follows_held`) and
    :func:`collective_shards_fit` — a dim smaller than its shard count is followed as upstream
    2.13's own ``cat``/``scatter``/``softmax`` strategies follow an input's layout, never made anew."""
    meta = src.tensor_meta
    try:
        memo_key = (src_keys, meta, dst_keys)
        hash(memo_key)
    except TypeError:
        memo_key = None
    if memo_key is not None and memo_key in memo:
        return memo[memo_key]
    spec = DTensorSpec(mesh, pl, tensor_meta=meta)
    ok = bool(fits) or all(type(p) is not Shard for p in pl) or is_tensor_shardable(
        meta.shape, spec, allow_unbacked_sharding=False
    )
    move = (spec, ok, redistribute_cost(src, spec) if ok else INF)
    if memo_key is not None:
        memo[memo_key] = move
    return move


def _total(spec: OpSpec) -> float:
    return sum(c for costs in spec.redistribute_cost for c in costs)


def descend(
    mesh: Any,
    inputs: Sequence[Input],
    dispatch_rows: Callable[[Sequence[Key]], Sequence[Row]],
    per_dim: Sequence[Row],
    spec: OpSpec,
    n_out: int,
    fixed: Mapping[int, int],
    allow_uneven_sharding: bool,
    memo: dict[Any, Any],
) -> tuple[list[Row], OpSpec]:
    """Improve the greedy strategy ``spec`` one mesh dim at a time with DTensor's real costs.

    The per-mesh-dim score cannot see how mesh dims interact: a local chunk on a mesh dim that
    moves nothing shrinks the gathers on the others; an all-to-all and an all-gather score
    alike on one mesh dim but leave different volumes for the next. While the strategy moves
    something, each mesh dim's row is swapped for every other usable row and the swap kept
    when DTensor's ``redistribute_cost`` of the whole strategy drops, until no swap helps
    (a coordinate descent: at most mesh dims x rows pricings per round, each move worked out
    once through ``memo``). Static shapes only (costs of symbolic sizes would guard).
    """
    best = _total(spec)
    rows = list(per_dim)
    start = rows
    pricer = Pricer(mesh, inputs, n_out, fixed, allow_uneven_sharding, memo)
    replicate: Row = [Replicate()] * (n_out + len(inputs))
    current = [[key(i.current.placements[m]) for i in inputs] for m in range(mesh.ndim)]
    improved = True
    while improved and best > 0:
        improved = False
        for m in range(mesh.ndim):
            for row in _candidates(replicate, dispatch_rows, current[m]):
                if row is rows[m]:
                    continue
                targets = [key(p) for p in row[n_out:]]
                if any(targets[i] != current[m][i] or key(row[o]) != current[m][i] for i, o in fixed.items()):
                    continue
                if any(transition_weight(c, t, i.integral) == INF for c, t, i in zip(current[m], targets, inputs)):
                    continue
                trial = [*rows[:m], row, *rows[m + 1 :]]
                cost = _cost(pricer, trial, best)
                if cost is not None and cost < best:
                    rows, best, improved = trial, cost, True
    if rows is not start:
        spec = priced_strategy(mesh, inputs, rows, n_out, fixed, allow_uneven_sharding, memo)  # type: ignore[assignment]
        assert spec is not None  # the pricer priced it: the same tests pass
    return rows, spec


def _cost(pricer: Pricer, per_dim: Sequence[Row], bound: float = INF) -> float | None:
    """The total cost of ``per_dim`` (None: unusable, or not below ``bound``), through the pricer
    where its rows are plain."""
    if pricer.plain(per_dim):
        return pricer.cost(per_dim, bound)
    priced = priced_strategy(pricer.mesh, pricer.inputs, per_dim, pricer.n_out, pricer.fixed,
                             pricer.allow_uneven_sharding, pricer.memo)
    return None if priced is None else _total(priced)


def _search(
    mesh: Any,
    inputs: Sequence[Input],
    dispatch_rows: Callable[[Sequence[Key]], Sequence[Row]],
    chosen: list[Row],
    spec: OpSpec | None,
    n_out: int,
    fixed: Mapping[int, int],
    allow_uneven_sharding: bool,
    memo: dict[Any, Any],
) -> tuple[list[Row], OpSpec] | None:
    """The greedy's choice moves something: search further, by DTensor's real cost.

    Where the usable rows give at most :data:`EXHAUSTIVE_PRODUCTS` products over the mesh dims,
    every product is priced (what upstream's expansion prices on every cache miss; moves are
    worked out once each through ``memo``), so the choice is the cheapest the rule allows.
    Otherwise rows are also picked in the other mesh-dim orders (a mesh dim whose inputs can
    stay as they are, picked first, is not blocked by an earlier choice), and the cheapest is
    improved by :func:`descend`."""
    per_dim = _usable_rows(mesh, inputs, dispatch_rows, n_out, fixed)
    pricer = Pricer(mesh, inputs, n_out, fixed, allow_uneven_sharding, memo)
    best_rows, best_cost = chosen, INF if spec is None else _total(spec)
    if math.prod(len(r) for r in per_dim) <= EXHAUSTIVE_PRODUCTS:
        for combo in itertools.product(*per_dim):
            cost = _cost(pricer, combo, best_cost)
            if cost is not None and cost < best_cost:
                best_rows, best_cost = list(combo), cost
        best = _spec_of(pricer, best_rows, chosen, spec)
        return None if best is None else (best_rows, best)
    sizes = tuple(mesh.shape) if allow_uneven_sharding else None
    for order in _orders(mesh.ndim):
        rows = greedy_rows(inputs, mesh.ndim, dispatch_rows, n_out, fixed, sizes, order)
        if rows is None or all(a is b for a, b in zip(rows, best_rows)):
            continue
        cost = _cost(pricer, rows, best_cost)
        if cost is not None and cost < best_cost:
            best_rows, best_cost = rows, cost
    best = _spec_of(pricer, best_rows, chosen, spec)
    if best is None:
        return None
    return descend(mesh, inputs, dispatch_rows, best_rows, best, n_out, fixed, allow_uneven_sharding, memo)


EXHAUSTIVE_PRODUCTS = 1024


def _spec_of(pricer: Pricer, rows: list[Row], chosen: list[Row], spec: OpSpec | None) -> OpSpec | None:
    """The priced spec of the winning ``rows`` (``spec`` when the greedy's own ``chosen`` won)."""
    if rows is chosen:
        return spec
    built = priced_strategy(pricer.mesh, pricer.inputs, rows, pricer.n_out, pricer.fixed,
                            pricer.allow_uneven_sharding, pricer.memo)
    assert built is not None  # the pricer priced it: the same tests pass
    return built


def _usable_rows(
    mesh: Any, inputs: Sequence[Input], dispatch_rows: Callable[[Sequence[Key]], Sequence[Row]], n_out: int,
    fixed: Mapping[int, int],
) -> list[list[Row]]:
    """Per mesh dim the rows (all-Replicate first) that keep written-into inputs as they are and
    move every input only in ways DTensor's dispatch runs."""
    replicate: Row = [Replicate()] * (n_out + len(inputs))
    out = []
    for m in range(mesh.ndim):
        current = [key(i.current.placements[m]) for i in inputs]
        rows = []
        for row in _candidates(replicate, dispatch_rows, current):
            targets = [key(p) for p in row[n_out:]]
            if any(targets[i] != current[i] or key(row[o]) != current[i] for i, o in fixed.items()):
                continue
            if all(transition_weight(c, t, i.integral) < INF for c, t, i in zip(current, targets, inputs)):
                rows.append(row)
        out.append(rows)
    return out


def _orders(ndim: int) -> list[tuple[int, ...]]:
    """Mesh-dim orders other than the natural one: all of them up to 3 mesh dims, else the reverse."""
    if ndim <= 3:
        return [o for o in itertools.permutations(range(ndim)) if o != tuple(range(ndim))]
    return [tuple(reversed(range(ndim)))]


def compact_strategy(
    mesh: Any,
    inputs: Sequence[Input],
    dispatch_rows: Callable[[Sequence[Key]], Sequence[Row]],
    *,
    n_out: int,
    fixed: Mapping[int, int],
    allow_uneven_sharding: bool = True,
) -> OpStrategy | None:
    """The greedy strategy and all-Replicate (unless the greedy one costs nothing), priced.

    None if neither is usable (e.g. an ``out=`` tensor laid out as no row can write): the
    caller's full expansion then gives upstream's answer or error.
    """
    replicate: Row = [Replicate()] * (n_out + len(inputs))
    sizes = tuple(mesh.shape) if allow_uneven_sharding else None
    chosen = greedy_rows(inputs, mesh.ndim, dispatch_rows, n_out, fixed, sizes)
    current = tuple(tuple(key(p) for p in i.current.placements) for i in inputs)
    specs: list[OpSpec] = []
    seen: set[Any] = set()
    memo: dict[Any, Any] = {}
    static = all(i.shape is not None for i in inputs)
    for per_dim in ([chosen] if chosen is not None else []) + [[replicate] * mesh.ndim]:
        sig = tuple(tuple(key(r[j]) for r in per_dim) for j in range(n_out + len(inputs)))
        if sig in seen:
            continue
        spec = priced_strategy(mesh, inputs, per_dim, n_out, fixed, allow_uneven_sharding, memo)
        if per_dim is chosen and static and (spec is None or _total(spec) > 0):
            found = _search(mesh, inputs, dispatch_rows, per_dim, spec, n_out, fixed, allow_uneven_sharding, memo)
            if found is not None:
                per_dim, spec = found
            sig = tuple(tuple(key(r[j]) for r in per_dim) for j in range(n_out + len(inputs)))
        if spec is not None:
            seen.add(sig)
            specs.append(spec)
            if sig[n_out:] == current or all(type(c[0]) is float and c[0] == 0.0 for c in spec.redistribute_cost):
                break  # nothing moves, or only local moves (R -> S / P cost 0): the all-Replicate fallback cannot be cheaper
    return OpStrategy(specs) if specs else None


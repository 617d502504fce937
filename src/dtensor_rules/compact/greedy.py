"""Dispatch's strategy from single-dim rows in O(mesh dims x rows x inputs), not rows ** mesh dims.

At dispatch every input holds ONE spec (its current layout), so the cheapest valid strategy
is mostly the one that moves nothing. Per mesh dim, each row is scored from the inputs'
current placements there (:func:`transition_weight` x the input's bytes) and the cheapest row
is kept (greedy over mesh dims, never mixing Partial kinds on one tensor). At most two
full-mesh strategies are priced with DTensor's real redistribute cost: that one and
all-Replicate (always valid). Both are products of valid single-dim rows, so validity is the
rule's table; the score only decides which valid strategy dispatch prices. It is a heuristic:
it may redistribute where a full search finds a cheaper valid strategy, never to an invalid one.

:func:`dispatch_inputs` says when this applies: every input has one spec in Shard / Replicate /
Partial placements with the default shard order. Otherwise (a solver's candidate layouts,
``_StridedShard``, ``_MaskPartial``, a non-default device order) callers use the full expansion.
"""

from __future__ import annotations

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
    is_tensor_shardable,
    redistribute_cost,
)

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


class ExactIntegerPartial:
    """Whether Replicate -> Partial(sum) is exact for integer tensors right now (the
    ``exact_int_partition`` patch of :mod:`dtensor_rules.ops._partial` switches it); upstream's
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
    return (t.__name__, repr(p))


def transition_weight(src: Key, dst: Key, integral: bool) -> float:
    """Relative collective volume of one input's change on one mesh dim (0 = no change).

    R -> S / P is a local op (tiny weight, so an unchanged layout wins ties); S -> R, S -> S',
    P -> S cost one all-gather / all-to-all / reduce-scatter of the input; P -> R and
    P -> P' an all-reduce (twice that). R -> P(sum) of an integer tensor only where the
    partition is exact (:class:`ExactIntegerPartial`).
    """
    if src == dst:
        return 0.0
    if integral and dst == ("P", "sum") and not ExactIntegerPartial.active:
        return INF
    if src == ("R",):
        return 1e-3
    if src[0] == "P":
        return 1.0 if dst[0] == "S" else 2.0
    return 1.0  # a shard: gather (then a local op) or all-to-all


def fill(p: Any) -> Any:
    """A row's placement as a real one (placeholders become plain Shard)."""
    return Shard(p.dim) if isinstance(p, ShardingPlaceholder) else p


def mixes_partials(keys: Sequence[Key]) -> bool:
    """One tensor Partial over different reduce ops on different mesh dims (sum with avg is fine)."""
    ops = {k[1] for k in keys if k[0] == "P"}
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
        dtype = spec.tensor_meta.dtype
        inputs.append(Input(s, spec, _static_bytes(spec.tensor_meta), not (dtype.is_floating_point or dtype.is_complex)))
    return inputs


def greedy_rows(
    inputs: Sequence[Input],
    ndim: int,
    dispatch_rows: Callable[[Sequence[Key]], Sequence[Row]],
    n_out: int,
    fixed: Mapping[int, int],
) -> list[Row] | None:
    """Per mesh dim the cheapest row from the current placements, keeping Partial kinds unmixed.

    ``fixed`` maps an input that is written into (``out=``, in-place self) to its output: its
    row placement must equal its current one and the output's.

    The first row of least cost wins (all-Replicate, then the rule's order). A row's score stops
    accumulating once it cannot beat the best so far, and a mesh dim stops at a row that moves
    nothing (no later row can be cheaper), so dispatch rarely scores every row of every input.
    """
    picked: list[Row] = []
    replicate: Row = [Replicate()] * (n_out + len(inputs))
    # per row (often the same cached objects on every mesh dim): its input keys and Partial columns
    facts_of: dict[int, tuple[list[Key], list[Key], tuple[tuple[int, Any], ...]]] = {}
    partial_ops_of: dict[int, set[Any]] = {}  # column -> reduce ops the picked rows put there
    nbytes = [i.nbytes for i in inputs]
    integral = [i.integral for i in inputs]
    n_in = len(inputs)
    for m in range(ndim):
        current = [key(i.current.placements[m]) for i in inputs]
        best, best_cost, best_partials = None, INF, ()
        for row in _candidates(replicate, dispatch_rows, current):
            facts = facts_of.get(id(row))
            if facts is None:
                keys = [key(p) for p in row]
                facts = facts_of[id(row)] = (keys, keys[n_out:], tuple((j, k[1]) for j, k in enumerate(keys) if k[0] == "P"))
            keys, targets, partials = facts
            if fixed and any(targets[i] != current[i] or keys[o] != current[i] for i, o in fixed.items()):
                continue
            cost = 0.0
            for i in range(n_in):
                if targets[i] != current[i]:
                    cost += transition_weight(current[i], targets[i], integral[i]) * nbytes[i]
                    if best is not None and cost >= best_cost:
                        break
            if best is not None and not cost < best_cost:
                continue
            if partial_ops_of and any(_mixes(partial_ops_of.get(j), op) for j, op in partials):
                continue
            best, best_cost, best_partials = row, cost, partials
            if cost == 0.0:
                break  # no row is cheaper than moving nothing (the first such row wins)
        if best is None:
            return None
        picked.append(best)
        for j, op in best_partials:
            partial_ops_of.setdefault(j, set()).add(op)
    return picked


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
            spec, ok, cost = _memo_move(memo, mesh, i.current, current_keys, pl, target_keys)
        if not ok:
            return None
        targets.append(spec)
        costs.append([cost])
    outs = [None if all(p is None for p in c) else DTensorSpec(mesh, c) for c in cols[:n_out]]
    if any(o is None for o in outs[:1]) and n_out == 1:
        return None
    return OpSpec(output_specs=outs[0] if n_out == 1 else tuple(outs), input_specs=targets, redistribute_cost=costs)


def _memo_move(
    memo: dict[Any, Any], mesh: Any, src: DTensorSpec, src_keys: Key, pl: tuple[Any, ...], dst_keys: Key
) -> tuple[DTensorSpec, bool, float]:
    """An input's move to placements ``pl``: (target spec, shardable, redistribute cost), worked
    out once per distinct (source layout, tensor meta, target layout) and shared — a cat of 8
    alike shards builds one target spec and plans one redistribution. A symbolic (unhashable)
    shape is worked out each time."""
    meta = src.tensor_meta
    try:
        memo_key = (src_keys, meta, dst_keys)
        hash(memo_key)
    except TypeError:
        memo_key = None
    if memo_key is not None and memo_key in memo:
        return memo[memo_key]
    spec = DTensorSpec(mesh, pl, tensor_meta=meta)
    ok = all(type(p) is not Shard for p in pl) or is_tensor_shardable(meta.shape, spec, allow_unbacked_sharding=False)
    move = (spec, ok, redistribute_cost(src, spec) if ok else INF)
    if memo_key is not None:
        memo[memo_key] = move
    return move


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
    chosen = greedy_rows(inputs, mesh.ndim, dispatch_rows, n_out, fixed)
    current = tuple(tuple(key(p) for p in i.current.placements) for i in inputs)
    specs: list[OpSpec] = []
    seen: set[Any] = set()
    memo: dict[Any, Any] = {}
    for per_dim in ([chosen] if chosen is not None else []) + [[replicate] * mesh.ndim]:
        sig = tuple(tuple(key(r[j]) for r in per_dim) for j in range(n_out + len(inputs)))
        if sig in seen:
            continue
        spec = priced_strategy(mesh, inputs, per_dim, n_out, fixed, allow_uneven_sharding, memo)
        if spec is not None:
            seen.add(sig)
            specs.append(spec)
            if sig[n_out:] == current or all(type(c[0]) is float and c[0] == 0.0 for c in spec.redistribute_cost):
                break  # nothing moves, or only local moves (R -> S / P cost 0): the all-Replicate fallback cannot be cheaper
    return OpStrategy(specs) if specs else None


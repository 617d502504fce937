"""Op strategies from single-dim rows without paying rows^ndim at dispatch.

Upstream's single-dim expansion offers every product of rows over the mesh dims and prices
each one (a redistribute cost per input); with cat's many Partial rows that is 450 priced
strategies on a (2, 2, 2) mesh and minutes for 6 inputs. Rules built with
:func:`rows_strategy` are ``op_strategy`` rules that look at the inputs' strategies:

- **dispatch** (every input holds ONE spec, its current layout): per mesh dim, each row is
  scored from the inputs' current placements on that dim (:func:`transition_weight` x the
  input's bytes) and the cheapest row is kept (greedy over mesh dims, never mixing Partial
  kinds on a tensor). At most two strategies are priced: that one and all-Replicate (always
  valid). Cost is O(mesh dims x rows x inputs); rules keep their rows polynomial in inputs.
- **solvers / the validator** (some input holds several candidate specs): every row over
  every mesh dim, expanded by upstream's ``expand_to_full_mesh_op_strategy``, the same set
  a single-dim rule would give — so completeness counts do not depend on this shortcut.

Every strategy either side emits is a product of valid single-dim rows, so validity is the
rule's table; the shortcut only decides which valid ones dispatch prices. The scoring is a
heuristic: dispatch may redistribute where the full enumeration found a cheaper valid
strategy, never to an invalid one. Placeholders become plain ``Shard`` (an input laid out
with ``_StridedShard`` is redistributed).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import torch
from dtensor_rules._upstream import (
    DTensorSpec,
    OpSchema,
    OpSpec,
    OpStrategy,
    ShardingPlaceholder,
    TupleStrategy,
    expand_to_mesh,
    is_tensor_shardable,
    redistribute_cost,
)
from torch.distributed.tensor.placement_types import Partial, Placement, Replicate, Shard

from dtensor_rules.ops._common import PlacementOrHole

Row = list[PlacementOrHole]
INF = float("inf")
# an unknown (symbolic) size is priced as this many elements: any positive guess keeps the
# order of transitions; the real redistribute costs of the two finalists decide
_UNKNOWN_ELEMS = 1 << 20


class Input(NamedTuple):
    """One flattened tensor input of the call: its strategy and (at dispatch) its current layout."""

    strategy: OpStrategy
    current: DTensorSpec
    nbytes: float
    integral: bool  # R -> P(sum) would turn it into floats


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


def _static_bytes(meta: Any) -> float:
    n = 1
    for s in meta.shape:
        n *= s if isinstance(s, int) else _UNKNOWN_ELEMS
    return float(n * meta.dtype.itemsize)


Key = tuple[Any, ...]


def key(p: PlacementOrHole) -> Key:
    """A cheap comparable stand-in for a placement (``Placement.__eq__`` costs ~14 us in 2.13).

    Placeholders key as the plain Shard they become; subclasses (``_StridedShard``,
    ``_MaskPartial``) never equal a row's placement, so such an input is always redistributed.
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
    P -> P' an all-reduce (twice that). R -> P(sum) divides by the mesh size, which is wrong
    for integers (DTensor returns floats), so it is never chosen for them.
    """
    if src == dst:
        return 0.0
    if integral and dst == ("P", "sum"):
        return INF
    if src == ("R",):
        return 1e-3
    if src[0] == "P":
        return 1.0 if dst[0] == "S" else 2.0
    return 1.0  # a shard (or a subclass): gather (then a local op) or all-to-all


def _fill(p: PlacementOrHole) -> Placement:
    return Shard(p.dim) if isinstance(p, ShardingPlaceholder) else p


def _mixes_partials(keys: Sequence[Key]) -> bool:
    ops = {k[1] for k in keys if k[0] == "P"}
    return len(ops) > 1 and ops != {"sum", "avg"}


def rows_strategy(
    op_schema: OpSchema,
    full_rows: Callable[[], list[Row]],
    dispatch_rows: Callable[[Sequence[Key]], list[Row]],
    *,
    n_out: int = 1,
    out_input: int | None = None,
    full: bool = False,
) -> OpStrategy:
    r"""The op strategy of a rule given as single-dim rows (see module docstring).

    ``full_rows()``: every valid row (all-Replicate implied). ``dispatch_rows(current)``: the
    rows worth scoring given one mesh dim's current input placements (as :func:`key`\ s; a
    subset of the valid rows, possibly built from ``current``). ``out_input``: index of an
    ``out=`` tensor among the inputs (never redistributed: its placements must be the output's).
    ``full``: every row over every mesh dim even at dispatch (what a solver's cost table wants).
    """
    strategies = flat_inputs(op_schema)
    mesh = strategies[0].strategies[0].output_spec.mesh
    width = n_out + len(strategies)
    replicate: Row = [Replicate()] * width
    if full or any(len(s.strategies) != 1 for s in strategies):
        expanded = _full_expansion(op_schema, strategies, [replicate, *([_fill(p) for p in r] for r in full_rows())], n_out)
        if not expanded.strategies:
            _no_out_layout(op_schema, strategies, out_input)
        return expanded
    inputs = []
    for s in strategies:
        spec = s.strategies[0].output_spec
        dtype = spec.tensor_meta.dtype
        inputs.append(Input(s, spec, _static_bytes(spec.tensor_meta), not (dtype.is_floating_point or dtype.is_complex)))
    chosen = _greedy_rows(inputs, mesh.ndim, dispatch_rows, n_out, out_input)
    current = tuple(tuple(key(p) for p in i.current.placements) for i in inputs)
    specs: list[OpSpec] = []
    seen: set[Any] = set()
    for per_dim in ([chosen] if chosen is not None else []) + [[replicate] * mesh.ndim]:
        cols = [tuple(_fill(r[j]) for r in per_dim) for j in range(width)]
        sig = tuple(tuple(key(p) for p in c) for c in cols)
        if sig in seen:
            continue
        spec = _op_spec(mesh, inputs, cols, sig, n_out, out_input)
        if spec is not None:
            seen.add(sig)
            specs.append(spec)
            if sig[n_out:] == current:
                break  # no input moves: nothing is cheaper, the all-Replicate fallback is not priced
    if not specs:
        _no_out_layout(op_schema, strategies, out_input)
    return OpStrategy(specs)


def _no_out_layout(op_schema: OpSchema, strategies: list[OpStrategy], out_input: int | None) -> None:
    """Only an out= tensor's fixed layout can leave no strategy: say so (upstream's wording for a
    result that cannot be written in place, which callers such as the validator recognise)."""
    out = tuple(strategies[out_input].strategies[0].output_spec.placements) if out_input is not None else ()
    raise RuntimeError(
        f"{op_schema.op}: in-place operations that require placement changes are not supported: no valid "
        f"strategy lays the result out like the out= tensor {out}; pass an out= DTensor laid out as the "
        "result can be (e.g. Replicate), or call the functional op"
    )


def _greedy_rows(
    inputs: list[Input],
    ndim: int,
    dispatch_rows: Callable[[Sequence[Key]], list[Row]],
    n_out: int,
    out_input: int | None,
) -> list[Row] | None:
    """Per mesh dim the cheapest row from the current placements, keeping Partial kinds unmixed."""
    picked: list[Row] = []
    picked_keys: list[list[Key]] = []
    replicate: Row = [Replicate()] * (n_out + len(inputs))
    keys_of: dict[int, list[Key]] = {}  # rows are often the same (cached) objects on every mesh dim
    for m in range(ndim):
        current = [key(i.current.placements[m]) for i in inputs]
        best, best_cost = None, INF
        for row in [replicate, *dispatch_rows(current)]:  # first of equal costs wins: R, then the rule's order
            keys = keys_of.get(id(row))
            if keys is None:
                keys = keys_of[id(row)] = [key(p) for p in row]
            if out_input is not None and keys[0] != current[out_input]:
                continue
            if picked and any(_mixes_partials([k[j] for k in picked_keys] + [keys[j]]) for j in range(len(keys))):
                continue
            cost = sum(
                transition_weight(c, t, i.integral) * i.nbytes for c, t, i in zip(current, keys[n_out:], inputs)
            )
            if cost < best_cost or best is None:
                best, best_cost, best_keys = row, cost, keys
        if best is None:
            return None
        picked.append(best)
        picked_keys.append(best_keys)
    return picked


def _op_spec(
    mesh: Any, inputs: list[Input], cols: list[tuple[Placement, ...]], sig: tuple[Any, ...], n_out: int, out_input: int | None
) -> OpSpec | None:
    """The full-mesh strategy laying tensor ``j`` out as ``cols[j]``, priced; None if unusable."""
    if any(_mixes_partials(c) for c in sig):
        return None
    targets = []
    for i, pl, k in zip(inputs, cols[n_out:], sig[n_out:]):
        spec = DTensorSpec(mesh, pl, tensor_meta=i.current.tensor_meta)
        unchanged = k == tuple(key(p) for p in i.current.placements)
        if not unchanged and not is_tensor_shardable(i.current.tensor_meta.shape, spec):
            return None
        if out_input is not None and i is inputs[out_input] and not unchanged:
            return None
        targets.append(spec)
    outs = [DTensorSpec(mesh, c) for c in cols[:n_out]]
    costs = [[redistribute_cost(s.output_spec, t) for s in i.strategy.strategies] for i, t in zip(inputs, targets)]
    return OpSpec(output_specs=outs[0] if n_out == 1 else tuple(outs), input_specs=targets, redistribute_cost=costs)


class LazyCosts(Sequence[list[float]]):
    """One strategy's per-input redistribute costs, computed on first read.

    With several candidate specs per input the full expansion has strategies x candidates
    costs per input (about a million for 3 inputs on a (2, 2, 2) mesh); a solver reads the ones
    it needs, a validator reads none. Shared ``memo``: one computation per (input, target).
    """

    def __init__(self, inputs: Sequence[OpStrategy], targets: Sequence[DTensorSpec], memo: dict[Any, list[float]]) -> None:
        self._inputs, self._targets, self._memo = inputs, targets, memo

    def __len__(self) -> int:
        return len(self._targets)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        t = self._targets[i]
        key = (i, t.placements)
        if key not in self._memo:
            self._memo[key] = [redistribute_cost(s.output_spec, t) for s in self._inputs[i].strategies]
        return self._memo[key]

    def __iter__(self) -> Iterator[list[float]]:
        return (self[i] for i in range(len(self)))


def _replicated_schema(op_schema: OpSchema) -> OpSchema:
    """``op_schema`` with every input but ``out=`` tensors (whose layout filters the strategies)
    replaced by one all-Replicate spec of the same meta: the expansion then prices nothing."""
    outs = {a.name for a in op_schema.op._schema.arguments if a.is_out}

    def swap(x: Any) -> Any:
        if isinstance(x, OpStrategy):
            spec = x.strategies[0].output_spec
            return OpStrategy([OpSpec(DTensorSpec(spec.mesh, (Replicate(),) * spec.mesh.ndim, tensor_meta=spec.tensor_meta))])
        if isinstance(x, TupleStrategy):
            return TupleStrategy([swap(c) for c in x.children])
        if isinstance(x, (list, tuple)):
            return type(x)(swap(c) for c in x)
        return x

    return OpSchema(
        op_schema.op,
        tuple(swap(a) for a in op_schema.args_schema),
        {k: v if k in outs else swap(v) for k, v in op_schema.kwargs_schema.items()},
        schema_info=op_schema.schema_info,
    )


def _full_expansion(op_schema: OpSchema, strategies: list[OpStrategy], rows: list[Row], n_out: int) -> OpStrategy:
    """Every row over every mesh dim (upstream's expansion, shardability judged from Replicate as
    the validator's single-dim path does), priced lazily against each input's real specs."""
    mesh = strategies[0].strategies[0].output_spec.mesh
    expanded = expand_to_mesh(mesh, _replicated_schema(op_schema), rows, input_index=n_out, allow_uneven_sharding=True)
    memo: dict[Any, list[float]] = {}
    for spec in expanded.strategies:
        spec.redistribute_cost = LazyCosts(strategies, list(spec.input_specs), memo)  # type: ignore[assignment]
    return expanded

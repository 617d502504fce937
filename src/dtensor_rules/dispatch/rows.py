"""``op_strategy`` rules written as single-dim rows that need the inputs' strategies (``cat``,
``slice_scatter``: their rows depend on which inputs are Partial right now).

- **dispatch** (every input holds ONE plain spec): :mod:`dtensor_rules.dispatch.greedy`, at most
  two priced strategies.
- **solvers / the validator** (some input holds several candidate specs) or ``full=True``:
  every row over every mesh dim, expanded by upstream's ``expand_to_full_mesh_op_strategy``,
  the same set a single-dim rule would give, priced lazily (:class:`LazyCosts`) — so
  completeness counts do not depend on the shortcut.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from dtensor_rules._upstream import (
    DTensorSpec,
    OpSchema,
    OpSpec,
    OpStrategy,
    TupleStrategy,
    expand_to_mesh,
    redistribute_cost,
)
from torch.distributed.tensor.placement_types import Replicate

from dtensor_rules.op_rules._solver_rows import trim_rows, trim_strategy
from dtensor_rules.dispatch.greedy import Key, Row, compact_strategy, dispatch_inputs, fill, flat_inputs
from dtensor_rules.dispatch.runnable import out_layout_error, runnable_only


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
    rows worth scoring given one mesh dim's current input placements (as
    :func:`~dtensor_rules.dispatch.greedy.key`\ s; a subset of the valid rows, possibly built
    from ``current``). ``out_input``: index of an ``out=`` tensor among the inputs (never
    redistributed: its placements must be the output's). ``full``: every row over every mesh
    dim even at dispatch (what a solver's cost table wants).
    """
    strategies = flat_inputs(op_schema)
    mesh = strategies[0].strategies[0].output_spec.mesh
    fixed = {} if out_input is None else {out_input: 0}
    inputs = None if full else dispatch_inputs(strategies)
    if inputs is not None:
        compact = compact_strategy(mesh, inputs, dispatch_rows, n_out=n_out, fixed=fixed)
        if compact is not None:
            return compact
    replicate: Row = [Replicate()] * (n_out + len(strategies))
    expanded = full_expansion(op_schema, strategies, [replicate, *([fill(p) for p in r] for r in full_rows())], n_out)
    if inputs is not None:  # plain inputs the greedy found no runnable move for: an out= layout
        expanded = runnable_only(expanded, [i.current for i in inputs])
    if not expanded.strategies:
        if inputs is not None:
            raise out_layout_error(op_schema.op, [i.current for i in inputs], fixed)
        _no_out_layout(op_schema, strategies, out_input)
    return expanded


def _no_out_layout(op_schema: OpSchema, strategies: list[OpStrategy], out_input: int | None) -> None:
    """Only an out= tensor's fixed layout can leave no strategy: say so (upstream's wording for a
    result that cannot be written in place, which callers such as the validator recognise)."""
    out = tuple(strategies[out_input].strategies[0].output_spec.placements) if out_input is not None else ()
    raise RuntimeError(
        f"{op_schema.op}: in-place operations that require placement changes are not supported: no valid "
        f"strategy lays the result out like the out= tensor {out}; pass an out= DTensor laid out as the "
        "result can be (e.g. Replicate), or call the functional op"
    )


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


def full_expansion(
    op_schema: OpSchema, strategies: list[OpStrategy], rows: list[Row], n_out: int, allow_uneven_sharding: bool = True
) -> OpStrategy:
    """Every row (placeholders filled, all-Replicate included) over every mesh dim: upstream's
    expansion with shardability judged from Replicate, as the validator's single-dim path does,
    priced lazily against each input's real (candidate) specs; a solver's query gets no dominated
    row (``op_rules._solver_rows``: trimmed unless its full-enumeration switch is on)."""
    mesh = strategies[0].strategies[0].output_spec.mesh
    expanded = trim_strategy(expand_to_mesh(
        mesh, _replicated_schema(op_schema), trim_rows(rows, strategies, n_out), input_index=n_out,
        allow_uneven_sharding=allow_uneven_sharding,
    ), strategies)
    memo: dict[Any, list[float]] = {}
    for spec in expanded.strategies:
        spec.redistribute_cost = LazyCosts(strategies, list(spec.input_specs), memo)  # type: ignore[assignment]
    return expanded

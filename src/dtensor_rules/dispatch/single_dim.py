"""A single-dim rule as the ``op_strategy`` function DTensor dispatch calls: compact at dispatch,
upstream's own expansion for everything else.

Upstream expands a single-dim rule to every product of its rows over the mesh dims and prices
each one with a redistribute cost per input: ``rows ** mesh.ndim`` strategies (fma: 1074 on an
8x8x8 mesh; scatter: 450), paid on every sharding-cache miss — and MoE token counts change
every step. :class:`SingleDimStrategy` (what the registry installs for a single-dim rule, the
one layer between DTensor and the rule) serves the rule so that:

- a **dispatch** query (every input one plain spec) gets
  :func:`dtensor_rules.dispatch.greedy.compact_strategy`: O(mesh dims x rows x inputs), at most
  two priced strategies;
- a query with several candidate layouts per input (a solver's) gets every row over every mesh
  dim (:func:`dtensor_rules.dispatch.rows.full_expansion`, costs computed on first read);
- one layout per input that is not plain (``_StridedShard``, ``_MaskPartial``, a non-default
  shard order) or no usable compact answer gets upstream's expansion of the same rule, exactly
  what DTensor does with the rule registered as single-dim — so errors are upstream's, except
  an ``out=`` layout no row writes (:mod:`~dtensor_rules.dispatch.out_layout`: a clear error).

Both see the rule's rows only, so neither can choose a layout the rule does not list.
Unknown (unbacked) sizes are never guarded on: the compact path treats them as not
shardable anew, and the fallback's ``SingleDimStrategyInfo`` carries
``allow_unbacked_sharding=False`` (an input already sharded there keeps its layout).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from torch._ops import OpOverload
from torch.distributed.tensor.placement_types import Replicate

from dtensor_rules._upstream import OpSchema, OpStrategy, SingleDimStrategyInfo, expand_single_dim_rule
from dtensor_rules.dispatch.greedy import Key, Row, compact_strategy, dispatch_inputs, fill, flat_inputs
from dtensor_rules.dispatch.out_layout import check_out_layouts, out_layouts, unwritable_out_error
from dtensor_rules.dispatch.rows import full_expansion
from dtensor_rules.dispatch.runnable import out_layout_error, runnable_only


def aliased_inputs(op: OpOverload, op_schema: OpSchema) -> dict[int, int]:
    """Flattened input index -> output index for tensors the op writes into: ``out=`` kwargs in
    schema order, and ``self`` of an in-place op (name ends in ``_``)."""
    fixed: dict[int, int] = {}
    if op._schema.name.split("::")[-1].endswith("_"):
        fixed[0] = 0
    outs = [a.name for a in op._schema.arguments if a.is_out]
    if outs:
        index = len(flat_inputs(OpSchema(op, op_schema.args_schema, {})))
        for name, value in op_schema.kwargs_schema.items():
            n = len(flat_inputs(OpSchema(op, (value,), {})))
            if name in outs and n == 1:
                fixed[index] = outs.index(name)
            index += n
    return fixed


RowsCheck = Callable[[OpOverload, Any, Any, Any, int], None]


def _no_check(op: OpOverload, rows: Any, args_meta: Any, kwargs_meta: Any, n_out: int) -> None:
    """Rows taken as given (a caller that built them itself)."""


class SingleDimStrategy(NamedTuple):
    """A single-dim rule as what DTensor calls (``op_strategy_funcs[op]``): ONE layer between
    DTensor and the rule. Each call asks the rule for its rows once, checks them (``check``: the
    registry's, raising ``RuleError`` naming the rule), and decides: dispatch query -> compact
    choice, solver query -> every row over every mesh dim, anything else -> upstream's expansion
    of the same (checked) rows. Behaviour rides on these fields, not on function attributes."""

    op: OpOverload
    rule: Callable[[Any, Any, Any], list[Row]]  # rows_fn(op, args_meta, kwargs_meta)
    n_out: int
    allow_uneven_sharding: bool = True
    check: RowsCheck = _no_check

    @property
    def __wrapped__(self) -> Callable[[Any, Any, Any], list[Row]]:
        """The rule (what ``inspect.unwrap`` and tools expect from a wrapper)."""
        return self.rule

    def rows(self, op: OpOverload, args_meta: Any, kwargs_meta: Any) -> list[Row]:
        """The rule's rows, checked: the single-dim function upstream's expansion calls."""
        rows = self.rule(op, args_meta, kwargs_meta)
        self.check(op, rows, args_meta, kwargs_meta, self.n_out)
        return rows

    def __call__(self, op_schema: OpSchema) -> OpStrategy:
        op, n_out = op_schema.op, self.n_out
        strategies = flat_inputs(op_schema)
        inputs = dispatch_inputs(strategies)
        solver = inputs is None and any(len(s.strategies) != 1 for s in strategies)
        rows: list[Row] | None = None
        if inputs is not None or solver:
            rows = self.rule(op, op_schema.args_meta, op_schema.kwargs_meta)
            self.check(op, rows, op_schema.args_meta, op_schema.kwargs_meta, n_out)
            if inputs is not None and all(p is not None for r in rows for p in r[n_out:]) \
                    and all(len(r) == n_out + len(inputs) for r in rows):
                compact = compact_strategy(
                    strategies[0].strategies[0].output_spec.mesh,
                    inputs,
                    _constant(rows),
                    n_out=n_out,
                    fixed=aliased_inputs(op, op_schema),
                    allow_uneven_sharding=self.allow_uneven_sharding,
                )
                if compact is not None:
                    return compact
            if solver:  # a solver's candidate layouts
                replicate: Row = [Replicate()] * (n_out + len(strategies))
                return full_expansion(op_schema, strategies, [replicate, *([fill(p) for p in r] for r in rows)], n_out,
                                      self.allow_uneven_sharding)
        # one layout each, not plain (or plain with no compact answer): upstream's own expansion
        outs = out_layouts(op, op_schema)
        if outs:  # an out= layout no row writes: the clear error, before expanding anything
            rows = self.rows(op, op_schema.args_meta, op_schema.kwargs_meta) if rows is None else rows
            check_out_layouts(op, outs, rows)
        info = SingleDimStrategyInfo(
            func=self.rows, allow_uneven_sharding=self.allow_uneven_sharding, allow_unbacked_sharding=False
        )
        mesh = strategies[0].strategies[0].output_spec.mesh
        expanded = expand_single_dim_rule(mesh, op_schema, info, None)(op, op_schema.args_meta, op_schema.kwargs_meta)
        if not expanded.strategies:  # only an out= / in-place tensor's fixed layout leaves nothing
            if outs and rows is not None:
                raise unwritable_out_error(op, outs, rows)
            raise RuntimeError(f"{op}: no valid sharding strategy for the input placements {op_schema}")
        if inputs is not None:  # plain inputs the greedy found no runnable move for: an out= / in-place layout
            current = [i.current for i in inputs]
            expanded = runnable_only(expanded, current)
            if not expanded.strategies:
                raise out_layout_error(op, current, aliased_inputs(op, op_schema))
        return expanded


def n_outputs(op: OpOverload) -> int:
    """Tensor outputs of ``op`` (the leading columns of a single-dim row)."""
    return sum(1 for r in op._schema.returns if "Tensor" in str(r.type))


def single_dim_op_strategy(
    op: OpOverload,
    rows_fn: Callable[[Any, Any, Any], list[Row]],
    *,
    allow_uneven_sharding: bool = True,
    check: RowsCheck = _no_check,
) -> SingleDimStrategy:
    """``rows_fn(op, args_meta, kwargs_meta) -> rows`` (a single-dim rule) as an ``op_strategy``."""
    return SingleDimStrategy(op, rows_fn, n_outputs(op), allow_uneven_sharding, check)


def _constant(rows: list[Row]) -> Callable[[Any], list[Row]]:
    def dispatch_rows(current: Any) -> list[Row]:
        return rows

    return dispatch_rows


__all__ = ["Key", "SingleDimStrategy", "aliased_inputs", "n_outputs", "single_dim_op_strategy"]

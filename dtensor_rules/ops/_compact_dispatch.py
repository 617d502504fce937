"""A compact strategy set for DTensor dispatch of single-dim rules with many Partial rows
(``prims.fma``: up to 13 rows per mesh dim, ``_softmax_backward_data``).

DTensor expands a single-dim rule to the product of its rows over the mesh dims (13^3 = 2197
candidate strategies on a 3-D mesh for fma, 13^4 on 4-D) and prices each. A solver or validator
query needs all of them; a dispatch does not, because the inputs' placements are known:

1. **exact match** (the common case): if on every mesh dim some row takes the inputs exactly as
   they are, that strategy needs no redistribution (cost 0, what the min-cost choice picks);
   :func:`compact_dispatch` runs the op locally with it and wraps the result. Work: rows x mesh
   dims, no product.
2. otherwise, upstream's dispatch path with the rows narrowed to those whose Partial inputs the
   inputs actually carry (a row needing an input to *become* Partial is never cheaper than one
   that keeps it replicated or sharded): :func:`compact_rows` reads the inputs' placements from a
   context variable that only this handler sets, so queries (no handler) see every row.

Both only drop strategies, never add one: every strategy dispatch can pick is a row of the rule.
Inputs with a non-default shard order, ``_StridedShard`` placements or an ``out=`` argument
always take path 2.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextvars import ContextVar
from typing import Any

from torch.distributed.tensor.placement_types import Partial, Placement, Replicate, Shard
from torch.utils._pytree import tree_map

from dtensor_rules._upstream import (
    DTensorSpec,
    ShardingPlaceholder,
    dispatch_slow_path,
    run_local_and_wrap,
    unwrap_to_op_info,
)

__all__ = ["compact_dispatch", "compact_rows"]

# per tensor input (rule column order), the placements it carries on any mesh dim; None outside dispatch
_CARRIED: ContextVar[tuple[frozenset[Placement], ...] | None] = ContextVar("dtensor_rules_carried", default=None)


def compact_rows(rows: list[list[Any]], n_out: int) -> list[list[Any]]:
    """``rows`` without those needing an input to be a Partial it is not (dispatch only)."""
    carried = _CARRIED.get()
    if carried is None:
        return rows
    return [
        r
        for r in rows
        if all(not isinstance(p, Partial) or (i < len(carried) and p in carried[i]) for i, p in enumerate(r[n_out:]))
    ]


def _input_specs(op_schema: Any) -> list[DTensorSpec]:
    specs = [a for a in op_schema.args_schema if isinstance(a, DTensorSpec)]
    return specs + [v for v in op_schema.kwargs_schema.values() if isinstance(v, DTensorSpec)]


def _plain(spec: DTensorSpec) -> bool:
    """Only Shard/Replicate/Partial placements in the default (left-to-right) shard order."""
    if any(type(p) not in (Shard, Replicate, Partial) for p in spec.placements):
        return False
    return spec.shard_order == DTensorSpec(spec.mesh, spec.placements).shard_order


def _filled(p: Any) -> Any:
    return Shard(p.dim) if isinstance(p, ShardingPlaceholder) else p


def exact_output(rows: Sequence[Sequence[Any]], n_out: int, inputs: Sequence[Sequence[Placement]]) -> list[Placement] | None:
    """Output placements (one output) of the strategy taking ``inputs`` as they are, or None.

    ``inputs[i][m]``: input i's placement on mesh dim m. Per mesh dim: the first row whose input
    columns equal the inputs' placements there (all-Replicate is implied).
    """
    lookup: dict[tuple[Any, ...], Any] = {}
    for r in rows:
        lookup.setdefault(tuple(_filled(p) for p in r[n_out:]), _filled(r[0]))
    out = []
    for m in range(len(inputs[0])):
        key = tuple(pl[m] for pl in inputs)
        if all(isinstance(p, Replicate) for p in key):
            out.append(Replicate())
        elif key in lookup:
            out.append(lookup[key])
        else:
            return None
    return out


def _meta_of(x: Any) -> Any:
    return x.tensor_meta if isinstance(x, DTensorSpec) else x


def compact_dispatch(op: Any, args: Any, kwargs: Any) -> Any:
    """DTensor handler: the zero-redistribution strategy when one exists, else upstream's
    dispatch with the rows narrowed to Partials the inputs carry."""
    from dtensor_rules.registry import get_rule

    op_info = unwrap_to_op_info(op, args, kwargs)
    schema = op_info.schema
    specs = _input_specs(schema)
    n_out = sum(1 for r in op._schema.returns if "Tensor" in str(r.type))
    carried = tuple(frozenset(s.placements) for s in specs)
    token = _CARRIED.set(carried)
    try:
        if n_out == 1 and not any(a.is_out for a in op._schema.arguments) and all(_plain(s) for s in specs):
            args_meta, kwargs_meta = tree_map(_meta_of, (tuple(schema.args_schema), dict(schema.kwargs_schema)))
            rows = get_rule(op).strategy(op, args_meta, kwargs_meta)
            out = exact_output(rows, n_out, [s.placements for s in specs])
            if out is not None:
                return run_local_and_wrap(op, op_info, out)
        return dispatch_slow_path(op, args, kwargs)
    finally:
        _CARRIED.reset(token)

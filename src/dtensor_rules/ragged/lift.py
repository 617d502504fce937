"""Ops on ragged DTensors that keep the placement: the "lift" rule (issue 19 item 3, design §5.3).

A row-preserving op (``silu``, ``mul``, ``add``, ``to(dtype)``, ``transpose``, ``silu_backward``,
...: output row ``i`` of the ragged dim depends only on input row ``i``) is exactly its
``Shard(d)`` behaviour on the ragged mesh dim, because the rows of a ragged shard are some rows
of the global tensor, whatever their sizes. So the rule is: substitute ``Shard(d)`` for every
``RaggedShard(d)``, let DTensor's own propagator (our rules or upstream's) choose, and accept
the choice only if it is local on the ragged mesh dim:

- every ragged input keeps its layout on every mesh dim (no redistribute of a ragged tensor:
  upstream's would treat it as even ``Shard(d)`` chunks);
- every other tensor input is ``Replicate`` on the ragged mesh dim before and after (a bias
  broadcast along other dims; a full-size ``Replicate`` operand would be cut in even chunks);
- each output is ``Shard(d')`` there with the ragged dim's length (becomes ``RaggedShard(d')``
  of the same partitions), or ``Partial(sum/max/min)`` (a reduction over the ragged rows: each
  rank holds a subset of them).

Anything else raises :class:`RaggedPlacementError` naming the layouts. The call runs on
DTensor's Python path and its result is not cached as a sharding (the cache-miss hook returns
it), so every call comes back here and the output gets the input's :class:`RaggedContext`
(the sizes the combine needs). Outputs of backward calls (gradients) carry no context: they
never need one (the moves' backward runs on local tensors).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch.distributed.tensor import DTensor, Partial, Shard
from torch.utils import _pytree as pytree

from dtensor_rules._upstream import DTensorSpec, OpSchema, dispatch_propagated, propagator, redistribute_args_to
from dtensor_rules._upstream.ragged import RaggedPlacementError
from dtensor_rules.ragged.context import attach, context_of
from dtensor_rules.ragged.placement import RaggedShard, is_ragged
from dtensor_rules.ragged.table import rule_for

__all__ = ["ragged_call", "has_ragged_spec"]

_REDUCE_OK = ("sum", "max", "min")


def _specs(schema: Any) -> list[Any]:
    return [s for s in pytree.tree_leaves((schema.args_schema, schema.kwargs_schema)) if isinstance(s, DTensorSpec)]


def has_ragged_spec(schema: Any) -> bool:
    """Whether any tensor argument of the call is laid out ragged."""
    return any(is_ragged(p) for s in _specs(schema) for p in s.placements)


def _ragged_of(specs: list[Any], op: Any) -> tuple[int, RaggedShard]:
    """The one (mesh dim, RaggedShard) every ragged input shares."""
    found = {(m, p) for s in specs for m, p in enumerate(s.placements) if is_ragged(p)}
    if len(found) != 1:
        raise RaggedPlacementError(
            f"{op}: its ragged inputs have different layouts {sorted(map(str, found))}; move them to one layout first "
            "(dtensor_rules.ragged.dispatch / combine)")
    (m, p), = found
    return m, p


def _plain(spec: Any) -> Any:
    placements = tuple(Shard(p.dim) if is_ragged(p) else p for p in spec.placements)
    return DTensorSpec(spec.mesh, placements, tensor_meta=spec.tensor_meta)


def _strict(placements: Any) -> list[tuple[type, Any]]:
    return [(type(p), p) for p in placements]  # Shard(d) == RaggedShard(d) may hold in one direction


def _reduces_only(now: Any, to: Any, m: int) -> bool:
    """Only ``Partial(sum) -> Replicate`` changes, on mesh dims other than the ragged one ``m``."""
    return all((type(p), p) == (type(q), q) if i == m or p == q else (isinstance(p, Partial) and p.reduce_op == "sum" and q.is_replicate())
               for i, (p, q) in enumerate(zip(now, to)))


def _substitute(tree: Any, fn: Any) -> Any:
    return pytree.tree_map(lambda s: fn(s) if isinstance(s, DTensorSpec) else s, tree)


def _refuse(op: Any, specs: list[Any], why: str) -> RaggedPlacementError:
    layouts = ", ".join(str(tuple(map(str, s.placements))) for s in specs)
    return RaggedPlacementError(
        f"{op} on ragged inputs ({layouts}) is not local on the ragged mesh dim: {why}. Only row-preserving ops whose "
        "other tensor inputs are Replicate on that mesh dim (or ragged the same way) run on a RaggedShard; move the "
        "tensor first (dtensor_rules.ragged.redistribute / gather)")


def _output_spec(op: Any, spec: Any, m: int, rp: RaggedShard, rows: int, specs: list[Any]) -> Any:
    p = spec.placements[m]
    if isinstance(p, Partial):
        if p.reduce_op not in _REDUCE_OK:
            raise _refuse(op, specs, f"a Partial({p.reduce_op}) result over uneven ragged rows")
        return spec
    if not (isinstance(p, Shard) and spec.tensor_meta is not None and spec.tensor_meta.shape[p.dim] == rows):
        raise _refuse(op, specs, f"its result would be {p} (not the ragged rows, row for row)")
    placements = list(spec.placements)
    placements[m] = RaggedShard(p.dim, rp.num_partitions, rp.aligned)
    return DTensorSpec(spec.mesh, tuple(placements), tensor_meta=spec.tensor_meta)


def _sharding(op: Any, schema: Any) -> tuple[Any, list[Any]]:
    """The ragged output sharding of a call and the layouts its flat args must take."""
    specs = _specs(schema)
    m, rp = _ragged_of(specs, op)
    rows = next(s.tensor_meta.shape[s.placements[m].dim] for s in specs if is_ragged(s.placements[m]))
    plain = OpSchema(schema.op, _substitute(schema.args_schema, _plain), _substitute(schema.kwargs_schema, _plain),
                     schema_info=schema.schema_info)
    out = propagator().propagate_op_sharding(plain)
    flat_now = [a for a in pytree.tree_leaves((schema.args_schema, schema.kwargs_schema))]
    if out.needs_redistribute:
        flat_to = list(pytree.tree_leaves(out.redistribute_schema.args_schema))
        flat_to += list(pytree.tree_leaves(out.redistribute_schema.kwargs_schema))
    else:
        flat_to = list(pytree.tree_leaves((plain.args_schema, plain.kwargs_schema)))
    targets = []
    for now, to in zip(flat_now, flat_to):
        if isinstance(now, DTensorSpec) and is_ragged(now.placements[m]):
            if _strict(to.placements) != _strict(_plain(now).placements):
                if not _reduces_only(_plain(now).placements, to.placements, m):
                    raise _refuse(op, specs, f"it would redistribute a ragged input to {tuple(map(str, to.placements))}")
                # Partial -> Replicate on another mesh dim (an all-reduce: elementwise, sizes never read)
                kept = tuple(now.placements[i] if i == m else q for i, q in enumerate(to.placements))
                targets.append(DTensorSpec(now.mesh, kept, tensor_meta=now.tensor_meta))
                continue
            targets.append(now)
        elif isinstance(now, DTensorSpec):
            if not (now.placements[m].is_replicate() and to.placements[m].is_replicate()):
                raise _refuse(op, specs, f"a non-ragged input is (or would become) {to.placements[m]} on mesh dim {m}")
            targets.append(to)
        else:
            targets.append(to)
    outs = out.output_spec
    if isinstance(outs, DTensorSpec):
        outs = _output_spec(op, outs, m, rp, rows, specs)
    elif outs is not None:
        outs = type(outs)(None if s is None else _output_spec(op, s, m, rp, rows, specs) for s in outs)
    return dataclasses.replace(out, output_spec=outs, needs_redistribute=False, redistribute_schema=None), targets


def ragged_call(op_call: Any, args: Any, kwargs: Any, op_info: Any) -> Any:
    """Run one call with a ragged input: its per-op rule (``ragged.table``) if any, else the lift rule."""
    rule = rule_for(op_call)
    if rule is not None:
        result = rule(op_call, args, kwargs)
        if result is not NotImplemented:
            return result
    sharding, targets = _sharding(op_call, op_info.schema)
    if any(t is not s for t, s in zip(targets, pytree.tree_leaves((op_info.schema.args_schema,
                                                                   op_info.schema.kwargs_schema)))):
        redistribute_args_to(op_info, targets[: len(pytree.tree_leaves(op_info.schema.args_schema))])
    op_info.output_sharding = sharding
    result = dispatch_propagated(op_call, args, op_info)
    if op_call._schema.name.endswith("_") and args and isinstance(args[0], DTensor):  # in place: the same tensor
        return args[0]
    ctx = next((c for c in (context_of(a) for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, DTensor))
                if c is not None), None)
    if ctx is not None:
        for r in pytree.tree_leaves(result):
            if isinstance(r, DTensor) and any(is_ragged(p) for p in r.placements) and not torch.compiler.is_compiling():
                attach(r, ctx)
    return result


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
from typing import Any, NamedTuple

import torch
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.utils import _pytree as pytree

from dtensor_rules._upstream import (
    DTensorSpec,
    OpSchema,
    dispatch_propagated,
    propagate_schema,
    redistribute_args_to,
    wrap_result,
)
from dtensor_rules._upstream.ragged import RaggedPlacementError
from dtensor_rules.ragged.context import attach, context_of
from dtensor_rules.ragged.placement import RaggedShard, is_ragged, other_dims_move
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


class Select(NamedTuple):
    """A Replicate operand (flat arg position) to cut to the ragged layout along its tensor dim ``dim``."""

    position: int
    dim: int


class Lifted(NamedTuple):
    """The lift rule's decision for one call."""

    sharding: Any  # OutputSharding with the ragged output spec(s)
    targets: list[Any]  # the layout each flat arg must take
    selects: list[Select]  # Replicate operands to select first (then the call is dispatched again)
    mesh_dim: int
    placement: RaggedShard


def _reduced(spec: Any, m: int) -> Any:
    """``spec`` with every ``Partial`` on a mesh dim other than ``m`` made ``Replicate`` (an all-reduce there)."""
    placements = tuple(Replicate() if i != m and p.is_partial() else p for i, p in enumerate(spec.placements))
    return DTensorSpec(spec.mesh, placements, tensor_meta=spec.tensor_meta)


def _sharding(op: Any, schema: Any) -> Lifted:
    """The ragged output sharding of a call and the layouts its flat args must take.

    If upstream's choice moves a ragged input along its ragged dim (e.g. a ``Partial`` over tp
    reduce-scattered onto the rows), the call is decided again with every ``Partial`` on the other mesh
    dims all-reduced first: a move that never touches the rows.
    """
    try:
        return _decide(op, schema, reduce_partials=False)
    except RaggedPlacementError:
        m, _ = _ragged_of(_specs(schema), op)
        if not any(p.is_partial() for s in _specs(schema) for i, p in enumerate(s.placements) if i != m):
            raise
        return _decide(op, schema, reduce_partials=True)


def _decide(op: Any, schema: Any, reduce_partials: bool) -> Lifted:
    specs = _specs(schema)
    m, rp = _ragged_of(specs, op)
    rows = next(s.tensor_meta.shape[s.placements[m].dim] for s in specs if is_ragged(s.placements[m]))
    base = (lambda s: _plain(_reduced(s, m))) if reduce_partials else _plain
    plain = OpSchema(schema.op, _substitute(schema.args_schema, base), _substitute(schema.kwargs_schema, base),
                     schema_info=schema.schema_info)
    out = propagate_schema(plain)
    flat_now = [a for a in pytree.tree_leaves((schema.args_schema, schema.kwargs_schema))]
    if out.needs_redistribute:
        flat_to = list(pytree.tree_leaves(out.redistribute_schema.args_schema))
        flat_to += list(pytree.tree_leaves(out.redistribute_schema.kwargs_schema))
    else:
        flat_to = list(pytree.tree_leaves((plain.args_schema, plain.kwargs_schema)))
    targets: list[Any] = []
    selects: list[Select] = []
    for now, to in zip(flat_now, flat_to):
        if isinstance(now, DTensorSpec) and is_ragged(now.placements[m]):
            if _strict(to.placements) != _strict(_plain(now).placements):
                kept_rp = tuple(now.placements[i] if i == m else q for i, q in enumerate(to.placements))
                if to.placements[m] != _plain(now).placements[m] or not other_dims_move(now.placements, kept_rp):
                    raise _refuse(op, specs, f"it would redistribute a ragged input to {tuple(map(str, to.placements))}")
                # a move on another mesh dim, off the ragged tensor dim (ranks of one ragged shard: sizes never read)
                kept = tuple(now.placements[i] if i == m else q for i, q in enumerate(to.placements))
                targets.append(DTensorSpec(now.mesh, kept, tensor_meta=now.tensor_meta))
                continue
            targets.append(now)
        elif isinstance(now, DTensorSpec):
            if (now.placements[m].is_replicate() and isinstance(to.placements[m], Shard) and now.tensor_meta is not None
                    and now.tensor_meta.shape[to.placements[m].dim] == rows and rows > 1):
                # a full-size Replicate operand row for row with the ragged rows (e.g. the gradient of a sum over
                # them): each rank selects its own rows with the sizes (ragged.distribute), no communication
                selects.append(Select(len(targets), to.placements[m].dim))
                targets.append(now)
                continue
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
    return Lifted(dataclasses.replace(out, output_spec=outs, needs_redistribute=False, redistribute_schema=None), targets,
                  selects, m, rp)


_VIEWS = (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default)


def _select_args(op_call: Any, args: Any, kwargs: Any, lifted: Lifted) -> Any:
    """Cut the Replicate operands ``lifted.selects`` names to the ragged layout and dispatch the call again."""
    flat, spec = pytree.tree_flatten((args, kwargs))
    ragged_in = [a for a in flat if isinstance(a, DTensor) and is_ragged(a.placements[lifted.mesh_dim])]
    ctx = next((c for c in map(context_of, ragged_in) if c is not None), None)
    if ctx is None or ctx.row_offset is not None:
        raise RaggedPlacementError(
            f"{op_call}: a Replicate operand of the ragged rows' size must be cut to their layout, but the ragged input "
            "carries no sizes (or is routed ids before their sort); cut it yourself with dtensor_rules.ragged.distribute")
    from dtensor_rules.ragged.moves import distribute

    for sel in lifted.selects:  # flat positions of the schema's leaves are the call's (a DTensorSpec per DTensor)
        t = flat[sel.position]
        flat[sel.position] = distribute(t, t.device_mesh, ctx.counts, lifted.mesh_dim, dim=sel.dim,
                                        aligned=lifted.placement.aligned, placements=t.placements)
    new_args, new_kwargs = pytree.tree_unflatten(flat, spec)
    return op_call(*new_args, **new_kwargs)


def _view(op_call: Any, args: Any, lifted: Lifted) -> Any:
    """``view`` / ``_unsafe_view``: the size argument is global; the ragged dim's local length is -1 (data)."""
    out = lifted.sharding.output_spec
    m = lifted.mesh_dim
    size = []
    for d, n in enumerate(out.tensor_meta.shape):
        sharded = [i for i, p in enumerate(out.placements) if isinstance(p, Shard) and p.dim == d and i != m]
        if is_ragged(out.placements[m]) and out.placements[m].dim == d:
            if sharded:
                raise _refuse(op_call, [out], "the ragged dim would also be sharded on another mesh dim")
            size.append(-1)
            continue
        for i in sharded:
            if n % out.mesh.size(i):
                raise _refuse(op_call, [out], f"view dim {d} ({n}) does not split evenly over mesh dim {i}")
            n //= out.mesh.size(i)
        size.append(n)
    x = args[0]
    return wrap_result(op_call(x.to_local(), size), out)


def ragged_call(op_call: Any, args: Any, kwargs: Any, op_info: Any) -> Any:
    """Run one call with a ragged input: its per-op rule (``ragged.table``) if any, else the lift rule."""
    rule = rule_for(op_call)
    if rule is not None:
        result = rule(op_call, args, kwargs)
        if result is not NotImplemented:
            return result
    lifted = _sharding(op_call, op_info.schema)
    if lifted.selects:
        return _select_args(op_call, args, kwargs, lifted)
    sharding, targets = lifted.sharding, lifted.targets
    leaves = pytree.tree_leaves((op_info.schema.args_schema, op_info.schema.kwargs_schema))
    moved = any(t is not s for t, s in zip(targets, leaves))
    if op_call in _VIEWS:  # upstream's suggestion also localises the size argument (even chunks): ours is _view's
        if any(t is not s for t, s in zip(targets, leaves) if isinstance(s, DTensorSpec)):
            raise _refuse(op_call, _specs(op_info.schema), "a view cannot move its input")
        return _attach_ctx(_view(op_call, args, lifted), args, kwargs)
    if moved:
        redistribute_args_to(op_info, targets[: len(pytree.tree_leaves(op_info.schema.args_schema))])
    op_info.output_sharding = sharding
    result = dispatch_propagated(op_call, args, op_info)
    if op_call._schema.name.endswith("_") and args and isinstance(args[0], DTensor):  # in place: the same tensor
        return args[0]
    return _attach_ctx(result, args, kwargs)


def _attach_ctx(result: Any, args: Any, kwargs: Any) -> Any:
    """Give every ragged output the context of the call's first ragged input that has one."""
    ctx = next((c for c in (context_of(a) for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, DTensor))
                if c is not None), None)
    if ctx is not None:
        for r in pytree.tree_leaves(result):
            if isinstance(r, DTensor) and any(is_ragged(p) for p in r.placements) and not torch.compiler.is_compiling():
                attach(r, ctx)
    return result


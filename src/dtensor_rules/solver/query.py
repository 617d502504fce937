"""Ask the installed sharding rules (ours or upstream's) for every node's strategies in solver mode.

Solver mode = each tensor argument is an ``OpStrategy`` holding *every* layout its producer may
output (several candidate specs per input), as an auto-sharding solver asks; a rule then answers
with every row it can run (not the one or two dispatch needs). The rule is read from DTensor's
propagator, so the answer is ours while :func:`dtensor_rules.install` is active and upstream's
after :func:`dtensor_rules.uninstall`. An op no rule answers for gets one all-Replicate row
(counted in :attr:`Strategies.fallbacks`), as a solver must still place it somewhere. No node is
offered a row that relabels a replicated value as a partial one (:func:`without_relabels`).
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch import fx
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.placement_types import Placement, Replicate, Shard
from torch.utils import _pytree as pytree

from dtensor_rules.op_rules._relabels import relabel_rows
from dtensor_rules.op_rules._solver_rows import is_full_enumeration
from dtensor_rules._upstream import (
    DTensorSpec,
    OpSchema,
    OpSpec,
    OpStrategy,
    TensorMeta,
    TupleStrategy,
    ShardingPlaceholder,
    expand_to_mesh,
    is_tensor_shardable,
    propagator,
)

__all__ = ["Layout", "Row", "Source", "NodeRows", "Strategies", "query_graph", "placeholder_options", "tensor_meta", "out_layouts",
           "without_relabels"]

Layout = tuple[Placement, ...]  # one placement per mesh dim


class Source(NamedTuple):
    """Where a tensor argument comes from: output ``index`` (``None``: the only one) of ``node``."""

    node: str
    index: int | None


class Row(NamedTuple):
    """One strategy of a node: its output layout(s) and the layout each tensor argument must have."""

    outs: tuple[Layout | None, ...]
    ins: tuple[Layout, ...]


class NodeRows(NamedTuple):
    """A node's candidate rows and what it reads: ``sources[i]`` feeds ``rows[*].ins[i]``."""

    name: str
    target: Any
    rows: list[Row]
    sources: tuple[Source, ...]
    metas: tuple[TensorMeta, ...]  # the tensor arguments' global metadata, aligned with sources


class Strategies(NamedTuple):
    nodes: dict[str, NodeRows]
    fallbacks: tuple[str, ...]  # nodes no rule answered for (one all-Replicate row)


def tensor_meta(v: Any) -> TensorMeta | None:
    if isinstance(v, torch.Tensor):
        return TensorMeta(shape=v.shape, stride=v.stride(), dtype=v.dtype)
    return None


def placeholder_options(mesh: DeviceMesh, meta: TensorMeta) -> list[Layout]:
    """Every Replicate / Shard(d) combination over the mesh dims that the shape can hold
    (AutoParallel's ``_create_all_options``: no Partial for inputs)."""
    per_dim: list[Placement] = [Replicate()] + [Shard(d) for d in range(len(meta.shape))]
    return [
        tuple(pl) for pl in itertools.product(per_dim, repeat=mesh.ndim)
        if is_tensor_shardable(meta.shape, DTensorSpec(mesh, tuple(pl), tensor_meta=meta))
    ]


def _resolve(node: fx.Node) -> Source:
    if node.op == "call_function" and node.target is operator.getitem:
        return Source(node.args[0].name, node.args[1])
    return Source(node.name, None)


def out_layouts(nr: NodeRows, index: int | None) -> list[Layout]:
    """The distinct layouts ``nr`` may output at ``index``, in first-seen order."""
    seen: dict[Layout, None] = {}
    for r in nr.rows:
        lay = r.outs[index or 0]
        if lay is not None:
            seen.setdefault(lay, None)
    return list(seen)


def _strategy_fn(op: Any) -> tuple[str, Any] | None:
    prop = propagator()
    info = prop.op_single_dim_strategy_funcs.get(op)
    if info is not None:
        return "single_dim", info
    fn = prop.op_strategy_funcs.get(op)
    return ("op_strategy", fn) if fn is not None else None


def _schema(node: fx.Node, candidates: dict[fx.Node, OpStrategy]) -> OpSchema:
    """The node's call with each tensor argument replaced by its candidate ``OpStrategy`` (lists
    of tensors become ``TupleStrategy``, as dispatch's ``_wrap_with_op_strategy`` does)."""

    def wrap(a: Any) -> Any:
        if isinstance(a, fx.Node):
            return candidates.get(a, a.meta.get("val"))
        if isinstance(a, (list, tuple)) and a and all(isinstance(c, fx.Node) for c in a):
            return TupleStrategy([candidates[c] for c in a])
        if isinstance(a, (list, tuple)) and any(isinstance(c, fx.Node) for c in a):
            return [wrap(c) if c is not None else None for c in a]
        return a

    op = node.target
    prop = propagator()
    info = prop.op_to_schema_info.get(op) or prop.op_to_schema_info_for_single_dim_strategy.get(op)
    args = tuple(wrap(a) for a in node.args)
    kwargs = {k: wrap(v) for k, v in node.kwargs.items()}
    return OpSchema(op, args, kwargs, schema_info=info) if info is not None else OpSchema(op, args, kwargs)


def _rows_of(strategy: OpStrategy, n_in: int) -> list[Row]:
    rows: dict[Row, None] = {}
    for spec in strategy.strategies:
        outs_spec = spec.output_specs
        outs = (tuple(outs_spec.placements),) if isinstance(outs_spec, DTensorSpec) else tuple(
            tuple(o.placements) if o is not None else None for o in outs_spec
        )
        if spec.input_specs is None:  # dispatch's rule: every input laid out like the output
            ins = (outs[0],) * n_in
        else:
            ins = tuple(tuple(s.placements) for s in spec.input_specs)
        if len(ins) == n_in:
            rows.setdefault(Row(outs, ins), None)  # AutoParallel's keep_unique_configs
    return list(rows)


def _ask(node: fx.Node, schema: OpSchema, n_in: int, mesh: DeviceMesh) -> list[Row]:
    found = _strategy_fn(node.target)
    if found is None:
        return []
    kind, fn = found
    if kind == "single_dim":
        # dispatch's own single-dim expansion takes one spec per input; with candidates, expand
        # the rule's rows (placeholders as plain Shard, all-Replicate added) over the mesh directly
        val = node.meta["val"]
        n_out = 1 if isinstance(val, torch.Tensor) else len(val)
        out_meta = tensor_meta(val) if isinstance(val, torch.Tensor) else tuple(tensor_meta(v) for v in val)
        rows = [[Shard(p.dim) if isinstance(p, ShardingPlaceholder) else p for p in r]
                for r in fn.func(node.target, schema.args_meta, schema.kwargs_meta)]
        if not any(all(p is None or isinstance(p, Replicate) for p in r) for r in rows):
            rows.insert(0, [Replicate()] * (n_out + n_in))
        strategy = expand_to_mesh(mesh, schema, rows, output_tensor_meta=out_meta, input_index=n_out,
                                  allow_uneven_sharding=getattr(fn, "allow_uneven_sharding", False))
    else:
        strategy = fn(schema)
    if isinstance(strategy, TupleStrategy):
        return []
    return _rows_of(strategy, n_in)


def without_relabels(rows: list[Row]) -> list[Row]:
    """``rows`` without those that relabel a replicated value as a partial one
    (:mod:`dtensor_rules.op_rules._relabels`), whichever rule offered them (ours are trimmed already,
    upstream's pointwise rules offer e.g. ``add(P(avg), R) -> P(avg)``): the row with that input
    ``Partial`` stays, and the ``Replicate -> Partial`` move is an edge the pricer prices. Every
    row under the full enumeration switch (:mod:`dtensor_rules.op_rules._solver_rows`)."""
    if is_full_enumeration():
        return rows
    drop = relabel_rows([(r.outs, r.ins) for r in rows])
    return [r for i, r in enumerate(rows) if i not in drop] if drop else rows


def _replicate_row(node: fx.Node, n_in: int, mesh: DeviceMesh) -> Row:
    R: Layout = (Replicate(),) * mesh.ndim
    val = node.meta["val"]
    n_out = 1 if isinstance(val, torch.Tensor) else len(val)
    return Row((R,) * n_out, (R,) * n_in)


def query_graph(gm: fx.GraphModule, mesh: DeviceMesh, fixed: dict[str, Sequence[Layout]] | None = None) -> Strategies:
    """Every node's rows in topological order. Placeholders get :func:`placeholder_options` (or
    ``fixed[name]``); getitem nodes are not nodes of their own (a consumer reads output ``i`` of
    the producer); ``output`` is left to the caller."""
    fixed = fixed or {}
    nodes: dict[str, NodeRows] = {}
    fallbacks: list[str] = []
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            meta = tensor_meta(node.meta["val"])
            opts = list(fixed.get(node.name) or placeholder_options(mesh, meta))
            nodes[node.name] = NodeRows(node.name, None, [Row((o,), ()) for o in opts], (), ())
            continue
        if node.op != "call_function" or node.target is operator.getitem:
            continue
        arg_nodes = [a for a in pytree.tree_leaves((node.args, node.kwargs)) if isinstance(a, fx.Node)]
        sources = tuple(_resolve(a) for a in arg_nodes)
        metas = tuple(tensor_meta(a.meta["val"]) for a in arg_nodes)
        candidates = {
            a: OpStrategy([OpSpec(DTensorSpec(mesh, lay, tensor_meta=m))
                           for lay in out_layouts(nodes[s.node], s.index)])
            for a, s, m in zip(arg_nodes, sources, metas)
        }
        n_in = len(arg_nodes)
        try:
            rows = _ask(node, _schema(node, candidates), n_in, mesh)
        except Exception:  # noqa: BLE001  a rule that refuses these candidates: the solver still needs a row
            rows = []
        if not rows:
            fallbacks.append(node.name)
            rows = [_replicate_row(node, n_in, mesh)]
        else:
            rows = without_relabels(rows)
        nodes[node.name] = NodeRows(node.name, node.target, rows, sources, metas)
    return Strategies(nodes, tuple(fallbacks))

"""Turn a traced graph's rows and prices into the data of a placement problem (no solver here).

One *choice* per node (which of its rows runs), one *edge* per tensor argument: the cost of
moving the producer's output layout ``u`` to the layout row ``o`` of the consumer reads,
``cost[o][u]``. The graph's outputs get sink nodes: a parameter's gradient must end laid out
like its parameter (the optimizer steps them together), the block's output like its input.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import NamedTuple

from torch import fx
from torch.distributed.device_mesh import DeviceMesh

from dtensor_rules._upstream import TensorMeta
from dtensor_rules.solver.price import Pricer, local_bytes
from dtensor_rules.solver.query import Layout, Row, Source, Strategies, out_layouts, tensor_meta
from dtensor_rules.solver.trace import JointGraph

__all__ = ["Choice", "Edge", "Problem", "build_problem"]


class Choice(NamedTuple):
    name: str
    rows: list[Row]
    compute_us: list[float]


class Edge(NamedTuple):
    """Argument ``arg`` of ``consumer`` reads output ``index`` of ``producer``."""

    consumer: str
    arg: int
    producer: str
    layouts: list[Layout]  # the producer's distinct output layouts
    producer_layout: list[int | None]  # producer row j -> the index of its output in ``layouts``
    cost: list[list[float]]  # cost[consumer row][layout index] in us (inf: impossible)


class Problem(NamedTuple):
    choices: dict[str, Choice]
    edges: list[Edge]
    ties: list[tuple[str, str]]  # pairs of choices with the same rows that must pick the same index
    memory: dict[str, list[int]]  # per parameter: rank-0 bytes of each row
    params: dict[str, str]  # parameter name -> its placeholder node


def _edge(consumer: str, arg: int, src: Source, strategies: Strategies,
          required: Sequence[Layout], meta: TensorMeta, pricer: Pricer) -> Edge:
    prod = strategies.nodes[src.node]
    layouts = out_layouts(prod, src.index)
    index = {lay: i for i, lay in enumerate(layouts)}
    producer_layout = [index.get(r.outs[src.index or 0]) for r in prod.rows]
    cost = [[pricer.edge_us(meta, lay, need) for lay in layouts] for need in required]
    return Edge(consumer, arg, src.node, layouts, producer_layout, cost)


def build_problem(jg: JointGraph, strategies: Strategies, pricer: Pricer, mesh: DeviceMesh) -> Problem:
    """The problem for ``jg`` (placeholders: params, buffers, input, tangent; see trace_joint)."""
    gm = jg.graph
    nodes = {n.name: n for n in gm.graph.nodes}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    param_nodes = dict(zip(jg.params, (n.name for n in placeholders[: len(jg.params)])))
    x_node, tangent = placeholders[-2].name, placeholders[-1].name
    choices: dict[str, Choice] = {}
    edges: list[Edge] = []
    for name, nr in strategies.nodes.items():
        node = nodes[name]
        compute = [0.0] * len(nr.rows) if node.op == "placeholder" else [
            pricer.compute_us(node, r, nr.metas) for r in nr.rows
        ]
        choices[name] = Choice(name, nr.rows, compute)
        for i, (src, meta) in enumerate(zip(nr.sources, nr.metas)):
            edges.append(_edge(name, i, src, strategies, [r.ins[i] for r in nr.rows], meta, pricer))
    ties = [(tangent, x_node)] if strategies.nodes[tangent].rows == strategies.nodes[x_node].rows else []
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    outs = out_node.args[0]
    owners = [x_node, *param_nodes.values()]  # out ~ input, grad_i ~ param_i
    for k, (val, owner) in enumerate(zip(outs, owners)):
        if not isinstance(val, fx.Node):
            continue
        src = Source(val.args[0].name, val.args[1]) if val.target is operator.getitem else Source(val.name, None)
        if src.node not in strategies.nodes:
            continue
        rows = [Row((r.outs[0],), (r.outs[0],)) for r in strategies.nodes[owner].rows]
        sink = f"sink_{k}_{owner}"
        choices[sink] = Choice(sink, rows, [0.0] * len(rows))
        meta = tensor_meta(val.meta["val"])
        edges.append(_edge(sink, 0, src, strategies, [r.ins[0] for r in rows], meta, pricer))
        ties.append((sink, owner))
    memory = {}
    for node_name in param_nodes.values():
        meta = tensor_meta(nodes[node_name].meta["val"])
        memory[node_name] = [local_bytes(meta, mesh, r.outs[0]) for r in choices[node_name].rows]
    return Problem(choices, edges, ties, memory, param_nodes)


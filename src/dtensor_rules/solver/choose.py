"""The whole pipeline in one call: trace, query, price, build, solve; the layout per parameter.

The rules asked are whichever are installed in DTensor right now (ours after
``dtensor_rules.install()``, upstream's after ``uninstall()``), so one process can compare them.
"""

from __future__ import annotations

import time
from typing import NamedTuple

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.placement_types import Shard

from dtensor_rules.ep.routed_experts_rule import ROUTED_EXPERTS
from dtensor_rules.solver.ilp import Solution, solve
from dtensor_rules.solver.price import Pricer
from dtensor_rules.solver.problem import Problem, build_problem
from dtensor_rules.solver.query import Layout, query_graph
from dtensor_rules.solver.ep_rows import add_ep_rows
from dtensor_rules.solver.trace import JointGraph, trace_joint

__all__ = ["Choice", "choose_placements", "param_layouts"]


class Choice(NamedTuple):
    """What the solver chose and what it took."""

    params: dict[str, Layout]  # parameter name -> its chosen layout
    input_layout: Layout
    objective_us: float
    variables: int
    constraints: int
    solve_s: float
    query_s: float  # tracing excluded: strategy queries + pricing
    fallbacks: tuple[str, ...]  # nodes no rule answered for (priced all-Replicate)
    problem: Problem
    solution: Solution
    routed_experts_node: str | None = None  # the forward routed-experts op's node, if the block has one


def param_layouts(problem: Problem, solution: Solution) -> dict[str, Layout]:
    return {p: problem.choices[n].rows[solution.choice[n]].outs[0] for p, n in problem.params.items()}


def choose_placements(module: nn.Module, x: torch.Tensor, mesh: DeviceMesh, *, memory_cap: float | None = None,
                      input_layout: Layout | None = None, hardware: str = "h100",
                      joint: JointGraph | None = None, ep_rows: bool = False,
                      hand_ep: dict[str, Layout] | None = None) -> Choice:
    """One placement per node of ``module(x)``'s training step on ``mesh`` (``x`` may be fake or meta).

    ``input_layout`` fixes the input (and the output's tangent); default: data parallel, tokens
    ``Shard(0)`` on every mesh dim (AutoParallel's default). ``memory_cap``: rank-0 bytes of all
    parameters together. ``joint``: a graph already traced by :func:`trace_joint` (reused across
    meshes and rule sets). ``ep_rows``: add the expert-parallel rows (``solver/ep_rows.py``:
    routed-rows labels between permute and combine, experts ``Shard(0)``), so EP is in the space;
    run such a choice with ``apply_choice(..., ep=True)``.
    ``hand_ep``: a hand expert-parallel layout priced by the same model: these parameter layouts
    fixed, ep = mesh dim 0, and the permute/dispatch/grouped-matmul/combine nodes offered only
    their expert-parallel rows (the solver still places everything else).
    """
    jg = joint or trace_joint(module, x)
    lay = tuple(input_layout) if input_layout is not None else (Shard(0),) * mesh.ndim
    ph = [n.name for n in jg.graph.graph.nodes if n.op == "placeholder"]
    t0 = time.perf_counter()
    fixed = {ph[-2]: [lay], ph[-1]: [lay]}
    if hand_ep is not None:
        fixed.update({node: [tuple(hand_ep[p])] for p, node in zip(jg.params, ph) if p in hand_ep})
    strategies = query_graph(jg.graph, mesh, fixed)
    if ep_rows or hand_ep is not None:
        strategies = add_ep_rows(jg.graph, strategies, mesh, ep_dims=(0,) if hand_ep is not None else None,
                                  force=hand_ep is not None)
    problem = build_problem(jg, strategies, Pricer(mesh, hardware), mesh)
    query_s = time.perf_counter() - t0
    sol = solve(problem, memory_cap)
    routed = next((n.name for n in jg.graph.graph.nodes if n.target is ROUTED_EXPERTS), None)
    return Choice(param_layouts(problem, sol), lay, sol.objective_us, sol.variables, sol.constraints, sol.solve_s,
                  query_s, strategies.fallbacks, problem, sol, routed)

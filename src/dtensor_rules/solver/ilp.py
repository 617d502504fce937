"""Choose one row per node by integer linear programming (PuLP + its bundled CBC).

AutoParallel's formulation, per tensor argument: a binary ``y[n, i, row, layout]`` says "node
``n`` runs ``row`` and its argument ``i`` arrives from the producer's output ``layout``"; its
cost is the move ``layout -> row's input layout`` (plus the row's compute, on argument 0). Rows
of a node are the same across its arguments; what a consumer reads equals what the producer
chose (flow); an impossible move is no variable at all (AutoParallel makes it and forces it
to 0). Producer rows with the same output layout share one
``layout`` index, so the edge variables count layouts, not rows. Parameters' rank-0 bytes, summed over the chosen rows, stay under a cap.
"""

from __future__ import annotations

import math
import time
import warnings
from typing import NamedTuple

import pulp

from dtensor_rules.solver.problem import Problem

__all__ = ["Solution", "solve", "total_cost"]


class Solution(NamedTuple):
    choice: dict[str, int]  # node -> chosen row index
    objective_us: float
    variables: int
    constraints: int
    solve_s: float  # CBC's wall time (building the model not included)
    status: str


def solve(problem: Problem, memory_cap: float | None = None, time_limit_s: float | None = None) -> Solution:
    """The cheapest consistent choice; raises ``RuntimeError`` when none meets the cap."""
    prob = pulp.LpProblem("placements", pulp.LpMinimize)
    counter = iter(range(1 << 62))

    def var() -> pulp.LpVariable:
        return prob.add_variable(f"v{next(counter)}", cat=pulp.LpBinary)

    by_consumer: dict[str, list] = {}
    for e in problem.edges:
        by_consumer.setdefault(e.consumer, []).append(e)
    objective = []
    # choice[n][row]: an expression that is 1 iff node n runs that row
    choice: dict[str, list] = {}
    arg_vars: dict[tuple[str, int], dict[tuple[int, int], pulp.LpVariable]] = {}
    for name, ch in problem.choices.items():
        edges = sorted(by_consumer.get(name, []), key=lambda e: e.arg)
        if not edges:
            xs = [var() for _ in ch.rows]
            choice[name] = xs
            objective += [c * x for c, x in zip(ch.compute_us, xs) if c]
            continue
        for e in edges:
            ys = {(row, layout): var() for row, row_cost in enumerate(e.cost)
                  for layout, c in enumerate(row_cost) if not math.isinf(c)}
            arg_vars[(name, e.arg)] = ys
            objective += [e.cost[row][layout] * y for (row, layout), y in ys.items() if e.cost[row][layout]]
        first = arg_vars[(name, edges[0].arg)]
        choice[name] = [pulp.lpSum(y for (r, _layout), y in first.items() if r == row) for row in range(len(ch.rows))]
        objective += [c * choice[name][row] for row, c in enumerate(ch.compute_us) if c]
        for e in edges[1:]:  # every argument agrees on the row
            ys = arg_vars[(name, e.arg)]
            for row in range(len(ch.rows)):
                prob += pulp.lpSum(y for (r, _layout), y in ys.items() if r == row) == choice[name][row]
    for name, xs in choice.items():
        prob += pulp.lpSum(xs) == 1
    for e in problem.edges:  # flow: the layout an argument arrives from is the one its producer outputs
        ys = arg_vars[(e.consumer, e.arg)]
        for layout in range(len(e.layouts)):
            produced = pulp.lpSum(choice[e.producer][j] for j, lay in enumerate(e.producer_layout) if lay == layout)
            prob += pulp.lpSum(y for (_row, lay), y in ys.items() if lay == layout) == produced
    for a, b in problem.ties:
        for xa, xb in zip(choice[a], choice[b]):
            prob += xa == xb
    if memory_cap is not None:
        prob += pulp.lpSum(b * x for n, bs in problem.memory.items() for b, x in zip(bs, choice[n])) <= memory_cap
    prob += pulp.lpSum(objective)
    n_vars = next(counter)
    t0 = time.perf_counter()
    with warnings.catch_warnings():  # PuLP 3.3 deprecates its bundled-CBC class for 4.0; 3.3.2 is pinned
        warnings.simplefilter("ignore", DeprecationWarning)
        status = prob.solve(pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit_s))
    solve_s = time.perf_counter() - t0
    status_name = pulp.LpStatus[status]
    if status_name != "Optimal":
        raise RuntimeError(f"no placement meets the constraints (CBC: {status_name}); raise memory_cap")
    picked = {n: max(range(len(xs)), key=lambda row: pulp.value(xs[row]) or 0.0) for n, xs in choice.items()}
    return Solution(picked, float(pulp.value(prob.objective) or 0.0), n_vars, prob.numConstraints(), solve_s, status_name)


def total_cost(problem: Problem, choice: dict[str, int]) -> float:
    """The objective of a full choice, summed directly (inf when a move is impossible)."""
    total = sum(problem.choices[n].compute_us[row] for n, row in choice.items())
    for e in problem.edges:
        layout = e.producer_layout[choice[e.producer]]
        total += math.inf if layout is None else e.cost[choice[e.consumer]][layout]
    return total

"""An auto-sharding solver over this package's rules (AutoParallel's approach, independent of it).

trace (joint fwd+bwd on fake tensors) -> query (every node's rows in solver mode) -> price
(compute: our formulas; moves: the planner) -> problem -> ilp (PuLP/CBC, memory cap) -> apply.
Needs the ``[solver]`` extra (PuLP). See docs/solver.md.
"""

from dtensor_rules.solver.apply import apply_choice, place_choice
from dtensor_rules.solver.choose import Choice, choose_placements, param_layouts
from dtensor_rules.solver.ilp import Solution, solve, total_cost
from dtensor_rules.solver.problem import Problem, build_problem
from dtensor_rules.solver.query import query_graph
from dtensor_rules.solver.trace import JointGraph, trace_joint

__all__ = [
    "Choice", "JointGraph", "Problem", "Solution", "apply_choice", "build_problem", "choose_placements",
    "param_layouts", "place_choice", "query_graph", "solve", "total_cost", "trace_joint",
]

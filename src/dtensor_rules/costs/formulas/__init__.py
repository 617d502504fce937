"""Cost formulas, one module per op family (the math only: each op's rule names its formula).

Ops without a rule here are priced by torch's flop formulas (:mod:`.torch_flops`) and the
generic families (:mod:`.generic`).
"""

from dtensor_rules.costs.formulas._formula import Formula, formula
from dtensor_rules.costs.formulas.generic import generic_cost

__all__ = ["Formula", "formula", "generic_cost"]

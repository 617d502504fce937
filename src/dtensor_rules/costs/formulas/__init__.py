"""Cost formulas: ``@formula(family=)`` and the fallbacks for ops without a rule's formula.

A family's own formula lives beside its rule (``dtensor_rules/op_rules/<family>.py``), which
names it in ``register(op, cost=...)``. Ops whose rule has none are priced by torch's flop
formulas (:mod:`.torch_flops`) and the generic families (:mod:`.generic`).
"""

from dtensor_rules.costs.formulas._formula import Formula, formula
from dtensor_rules.costs.formulas.generic import generic_cost

__all__ = ["Formula", "formula", "generic_cost"]

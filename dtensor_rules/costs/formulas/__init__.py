"""Per-op cost formulas, one module per op family; importing this package fills :data:`TABLE`."""

from dtensor_rules.costs.formulas import counting, indexing, matmul, pointwise, sorting, torch_flops  # noqa: F401
from dtensor_rules.costs.formulas._table import TABLE, Formula, formula
from dtensor_rules.costs.formulas.generic import generic_cost

__all__ = ["TABLE", "Formula", "formula", "generic_cost"]

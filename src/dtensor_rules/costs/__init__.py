"""Cost model: per-op flops/bytes (:func:`estimate`), hardware profiles, roofline runtime,
``FlopCounterMode`` registration and per-strategy cost tables for an auto-sharding solver.
See docs/costs.md.
"""

from dtensor_rules.costs._util import CostError
from dtensor_rules.costs.hardware import HARDWARE, Hardware, dtype_class, get_hardware, register_hardware
from dtensor_rules.costs.estimator import estimate, estimate_call
from dtensor_rules.costs.op_cost import OpCost
from dtensor_rules.costs.runtime import peak_flops, runtime
from dtensor_rules.costs.strategy_costs import StrategyCost, format_strategy_costs, strategy_costs
from dtensor_rules.costs.flop_counter import register_flop_formulas, unregister_flop_formulas

__all__ = [
    "CostError",
    "HARDWARE",
    "Hardware",
    "OpCost",
    "StrategyCost",
    "format_strategy_costs",
    "strategy_costs",
    "register_flop_formulas",
    "unregister_flop_formulas",
    "dtype_class",
    "estimate",
    "estimate_call",
    "get_hardware",
    "peak_flops",
    "register_hardware",
    "runtime",
]

"""How costs finds the rules' cost formulas without importing the registry.

The registry imports costs (to turn ``flops=``/``bytes=`` into a formula), so costs must not
import the registry back. Instead the registry hands its live rule table to :func:`use_rules`
once, when it is imported; :func:`estimate_call` and :func:`strategy_costs` read rules here.
Until then (costs imported on its own, which ``import dtensor_rules`` never does) no op has a
rule and estimates fall through to torch's and the generic formulas.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

from torch._ops import OpOverload

if TYPE_CHECKING:  # op_cost reads rules from here: a runtime import would be a cycle
    from dtensor_rules.costs.op_cost import Formula

__all__ = ["PricedRule", "use_rules", "rule_for", "rule_formulas"]


class PricedRule(Protocol):
    """The parts of a ``dtensor_rules.registry.Rule`` costs reads."""

    op: OpOverload
    strategy: Callable[..., Any]
    kind: str
    cost: Formula | None
    schema_info: Any
    allow_uneven_sharding: bool


_rules: Mapping[OpOverload, PricedRule] = MappingProxyType({})


def use_rules(rules: Mapping[OpOverload, PricedRule]) -> None:
    """Read rules from ``rules`` (a live read-only view of the registry's table) from now on."""
    global _rules
    _rules = rules


def rule_for(op: OpOverload) -> PricedRule | None:
    """The registered rule of ``op``, or None."""
    return _rules.get(op)


def rule_formulas() -> dict[OpOverload, Formula]:
    """``op -> cost formula`` of every registered rule that has one."""
    return {op: r.cost for op, r in list(_rules.items()) if r.cost is not None}

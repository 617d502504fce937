"""``@formula(family=)``: write a cost formula against schema names, get a ``Formula``.

A formula defines the math; it keeps no table. Our op modules define theirs beside the rule
and name it in the ``register(..., cost=...)`` call, so each op's cost lives in its rule (one contract).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from torch._ops import OpOverload

from dtensor_rules.costs._util import bind
from dtensor_rules.costs.op_cost import Formula, OpCost

__all__ = ["Formula", "formula"]


def formula(*, family: str) -> Callable[[Callable[[OpOverload, dict[str, Any]], OpCost]], Formula]:
    """Turn ``fn(op, bound_args) -> OpCost`` into a :data:`Formula` ``(op, args, kwargs) -> OpCost``.

    ``bound_args`` maps the op's schema names to values (defaults filled). ``family`` is
    stamped on the result (``OpCost.family``) unless ``fn`` set one.
    """

    def deco(fn: Callable[[OpOverload, dict[str, Any]], OpCost]) -> Formula:
        def run(op: OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> OpCost:
            cost = fn(op, bind(op, args, kwargs))
            return cost if cost.family else replace(cost, family=family)

        run.__name__ = fn.__name__
        run.__qualname__ = fn.__qualname__
        run.__doc__ = fn.__doc__
        run.__module__ = fn.__module__
        run.family = family  # type: ignore[attr-defined]  (read by costs.flop_counter)
        return run

    return deco

"""The per-op formula table: ``OpOverload -> formula(op, args, kwargs) -> OpCost``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dataclasses import replace

from torch._ops import OpOverload

from dtensor_rules.costs._util import bind
from dtensor_rules.costs.op_cost import OpCost

Formula = Callable[[OpOverload, tuple[Any, ...], dict[str, Any]], OpCost]
TABLE: dict[OpOverload, Formula] = {}


def formula(
    *ops: OpOverload, family: str
) -> Callable[[Callable[[OpOverload, dict[str, Any]], OpCost]], Callable[..., OpCost]]:
    """Register ``fn(op, bound_args) -> OpCost`` for each op; ``bound_args`` maps schema names to values.

    ``family`` is stamped on the result (``OpCost.family``) unless ``fn`` set one.
    """

    def deco(fn: Callable[[OpOverload, dict[str, Any]], OpCost]) -> Callable[..., OpCost]:
        def run(op: OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> OpCost:
            cost = fn(op, bind(op, args, kwargs))
            return cost if cost.family else replace(cost, family=family)

        run.__name__ = fn.__name__
        run.__doc__ = fn.__doc__
        for op in ops:
            if op in TABLE:
                raise RuntimeError(f"duplicate cost formula for {op}")
            TABLE[op] = run
        return fn

    return deco

"""The per-op ragged rules: which package function runs an op call that has a ragged operand.

:func:`dtensor_rules.ragged.lift.ragged_call` (every call with a ``RaggedShard`` operand reaches it
through the cache-miss hook, never cached) looks the op up here first; an op not listed, or a rule
that returns ``NotImplemented`` (e.g. ``cumsum`` over a non-ragged dim), goes to the lift rule.
Rules register themselves at import (``dtensor_rules.ragged`` imports every rule module).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["ragged_rule", "rule_for", "ragged_ops"]

Rule = Callable[[Any, tuple[Any, ...], dict[str, Any]], Any]
_RULES: dict[Any, Rule] = {}


def ragged_rule(*ops: Any) -> Callable[[Rule], Rule]:
    """Decorator: ``fn(op, args, kwargs)`` runs each of ``ops`` when an operand is ragged."""
    def deco(fn: Rule) -> Rule:
        for op in ops:
            if op in _RULES:
                raise ValueError(f"{op} already has a ragged rule ({_RULES[op].__name__})")
            _RULES[op] = fn
        return fn
    return deco


def rule_for(op: Any) -> Rule | None:
    """The ragged rule of ``op``, if one is registered."""
    return _RULES.get(op)


def ragged_ops() -> dict[Any, str]:
    """Every op with a ragged rule and the rule's name (docs and tests)."""
    return {op: fn.__name__ for op, fn in _RULES.items()}

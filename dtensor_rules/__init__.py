"""dtensor_rules: complete, proven DTensor sharding rules for MoE ops, cost formulas,
and an ordered-mesh redistribute planner.

``import dtensor_rules`` registers the shipped rules (it imports :mod:`dtensor_rules.ops`,
whose modules each state their ops' contracts with ``register(...)``; the registry imports no
op module) and installs them into DTensor's dispatch (policy "override") unless the
environment variable ``DTENSOR_RULES_NO_INSTALL=1`` is set.
"""

from __future__ import annotations

import os

MIN_TORCH = (2, 13)


def _check_torch() -> None:
    try:
        import torch
    except ImportError as e:  # pragma: no cover - exercised only without torch
        raise ImportError("dtensor_rules needs PyTorch >= 2.13: pip install torch==2.13.0") from e
    version = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    if version < MIN_TORCH:
        raise ImportError(
            f"dtensor_rules needs torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]}, found {torch.__version__}; "
            "upgrade with: pip install 'torch==2.13.0'"
        )


_check_torch()

from dtensor_rules.registry import (  # noqa: E402
    Rule,
    RuleError,
    get_rule,
    install,
    installed,
    register,
    rules,
    status,
    uninstall,
)
from dtensor_rules import ops  # noqa: E402,F401  (the one place that loads the shipped rules)
from dtensor_rules.costs import register_flop_formulas as _register_flops  # noqa: E402
from dtensor_rules.redistribute import distribute_tensor, plan, redistribute  # noqa: E402,F401

_register_flops()  # FlopCounterMode counts ops torch prices at 0 (idempotent; costs.unregister_flop_formulas undoes it)

__version__ = "0.1.0"
__all__ = [
    "Rule",
    "RuleError",
    "get_rule",
    "install",
    "installed",
    "register",
    "rules",
    "status",
    "uninstall",
]

if os.environ.get("DTENSOR_RULES_NO_INSTALL", "") not in ("1", "true", "True"):
    install()

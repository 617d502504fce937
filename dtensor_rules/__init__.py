"""dtensor_rules: complete, proven DTensor sharding rules for MoE ops, cost formulas,
and an ordered-mesh redistribute planner.

``import dtensor_rules`` installs our rules into DTensor's dispatch (policy "measured": ours
where upstream has no rule, or where ours is measured strictly better on this torch release;
``status()`` says which and why) unless the environment variable ``DTENSOR_RULES_NO_INSTALL=1``
is set. Tested on torch 2.13 and 2.14 (setup.py: ``torch>=2.13,<2.15``).
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
    from dtensor_rules._upstream.version import TESTED_TORCH

    if version > max(TESTED_TORCH):
        import warnings

        newest = ".".join(map(str, max(TESTED_TORCH)))
        warnings.warn(
            f"dtensor_rules is tested on torch {MIN_TORCH[0]}.{MIN_TORCH[1]} to {newest}, found {torch.__version__}: "
            "upstream's private DTensor internals may have changed (tests/test_upstream_contract.py checks them), "
            "and install() keeps upstream's rule wherever it has one (no measurement for this release)",
            stacklevel=2,
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
from dtensor_rules import ops  # noqa: E402,F401  (registers the shipped rules)
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

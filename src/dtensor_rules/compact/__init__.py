"""Deprecated alias of :mod:`dtensor_rules.dispatch` (renamed: the package is what DTensor calls on
a sharding-cache miss, the strategy choice). Importing it, or any of its old submodules, warns once
and hands back the new modules themselves, so monkeypatches and isinstance checks keep working."""

from __future__ import annotations

import importlib
import sys
import warnings

warnings.warn(
    "dtensor_rules.compact is deprecated: import dtensor_rules.dispatch instead "
    "(dtensor_rules.compact.greedy -> dtensor_rules.dispatch.greedy, and so on)",
    DeprecationWarning,
    stacklevel=2,
)

_SUBMODULES = ("greedy", "rows", "runnable", "single_dim")

for _name in _SUBMODULES:
    _module = importlib.import_module(f"dtensor_rules.dispatch.{_name}")
    sys.modules[f"{__name__}.{_name}"] = _module
    globals()[_name] = _module

"""Test helpers shipped with the package so users can check their own rules.

- :func:`simulated_mesh`: a real DeviceMesh with every rank simulated in-process.
- :func:`run_gloo`: run a function on real multi-process gloo ranks.
- :func:`local_shards`: every rank's local shard of a DTensor (simulated) or this rank's (real PG).
- :func:`check_rule`: compare a rule (ours and upstream's) with ground truth.
- :mod:`dtensor_rules.testing.strategies`: hypothesis strategies for meshes, placements, shapes.

The names load at first use: ``import dtensor_rules`` imports no module of this package (a rule's
sample suite is a plain function beside it in :mod:`dtensor_rules.op_rules`), and a suite's first call should not pay for the validator and the mesh
helpers (~12 ms) until someone checks a rule.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOME = {
    "simulated_mesh": "mesh", "fake_world": "mesh", "run_gloo": "mesh", "local_shards": "shards",
    "check_rule": "validator", "check_samples": "validator", "RuleReport": "validator", "RuleCheckError": "validator", "SideReport": "validator",
}
__all__ = list(_HOME)


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME))

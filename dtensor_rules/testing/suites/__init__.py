"""Fixed sample suites per op: the inputs `validate` and `benchmarks/rule_coverage.py` use.

Each suite module registers ``@suite(op, ...)`` functions returning a list of
``(args, kwargs)``; tensors are built from a fixed seed so every run sees the same data.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._ops import OpOverload

Samples = list[tuple[tuple[Any, ...], dict[str, Any]]]


def generator(seed: int) -> torch.Generator:
    """A seeded generator: every run of a suite sees the same data."""
    return torch.Generator().manual_seed(seed)
_SUITES: dict[OpOverload, Callable[[], Samples]] = {}


def suite(*ops: OpOverload) -> Callable[[Callable[[], Samples]], Callable[[], Samples]]:
    def deco(fn: Callable[[], Samples]) -> Callable[[], Samples]:
        for op in ops:
            if op in _SUITES:
                raise ValueError(f"{op} already has a sample suite ({_SUITES[op].__module__})")
            _SUITES[op] = fn
        return fn

    return deco


def _load() -> None:
    from dtensor_rules.testing.suites import (  # noqa: F401
        counting,
        gather_scatter,
        grouped_mm,
        indexing,
        moe_index,
        pointwise,
        scan,
        slicing,
        sorting,
    )


def suites() -> dict[OpOverload, Callable[[], Samples]]:
    _load()
    return dict(_SUITES)


def samples_for(op: OpOverload) -> Samples:
    _load()
    if op not in _SUITES:
        raise KeyError(f"no sample suite for {op}; ops with suites: {sorted(map(str, _SUITES))}")
    return _SUITES[op]()


def _ruled_without_suite(name: str) -> str | None:
    """The registered op ``name`` spells, when it has a rule but no suite (e.g. an ``.out`` variant)."""
    from dtensor_rules import registry

    for op in registry.rules():
        if name in (str(op), op.name().replace("::", ".")):
            return str(op)
    return None


def find_op(name: str) -> OpOverload:
    """Resolve 'cumsum', 'aten.cumsum', 'aten.cumsum.default' or 'prims.fma' to an op with a suite."""
    _load()
    name = name.replace("::", ".")
    matches = [op for op in _SUITES if name in (str(op), op.name().replace("::", "."), str(op).rsplit(".", 1)[0], op._opname)]
    matches = [op for op in matches if str(op).endswith(".default")] or matches
    if len(matches) == 1:
        return matches[0]
    if not matches:
        known = ", ".join(sorted(map(str, _SUITES)))
        ruled = _ruled_without_suite(name)
        if ruled:
            raise KeyError(f"{ruled} has our rule (see `status`) but no sample suite, so `validate` cannot run it; "
                           f"ops with suites: {known}")
        raise KeyError(f"unknown op {name!r}; known: {known}")
    raise KeyError(f"{name!r} is ambiguous: {', '.join(sorted(map(str, matches)))}")

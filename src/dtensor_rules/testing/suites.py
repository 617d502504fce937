"""The fixed sample suites `validate` and `benchmarks/rule_coverage.py` check rules on, looked up by op.

A suite is a plain function beside its rule in :mod:`dtensor_rules.op_rules` (``register(op,
samples=...)``) returning a list of ``(args, kwargs)`` built from a fixed seed, so every run sees
the same data. Defining one builds no tensor, so the rules carry them at no import cost. The
lookups below read the registered rules.
"""

from __future__ import annotations

from collections.abc import Callable

from torch._ops import OpOverload

from dtensor_rules import registry
from dtensor_rules.op_rules._common import Samples


def suites() -> dict[OpOverload, Callable[[], Samples]]:
    """``op -> samples`` of every registered rule that has a sample suite."""
    return {op: rule.samples for op, rule in registry.rules().items() if rule.samples is not None}


def samples_for(op: OpOverload) -> Samples:
    """The sample suite of ``op``'s rule, called; KeyError naming the gap if it has none."""
    rule = registry.rules().get(op)
    if rule is None or rule.samples is None:
        why = "it has no rule" if rule is None else (rule.gaps or "its rule names no samples=")
        raise KeyError(f"no sample suite for {op} ({why}); ops with suites: {sorted(map(str, suites()))}")
    return list(rule.samples())


def _ruled_without_suite(name: str) -> registry.Rule | None:
    """The rule of the registered op ``name`` spells, when it has no suite (e.g. an ``.out`` variant)."""
    for op, rule in registry.rules().items():
        if name in (str(op), op.name().replace("::", ".")):
            return rule
    return None


def find_op(name: str) -> OpOverload:
    """Resolve 'cumsum', 'aten.cumsum', 'aten.cumsum.default' or 'prims.fma' to an op whose rule has samples."""
    known = suites()
    name = name.replace("::", ".")
    matches = [op for op in known if name in (str(op), op.name().replace("::", "."), str(op).rsplit(".", 1)[0], op._opname)]
    matches = [op for op in matches if str(op).endswith(".default")] or matches
    if len(matches) == 1:
        return matches[0]
    if not matches:
        names = ", ".join(sorted(map(str, known)))
        ruled = _ruled_without_suite(name)
        if ruled is not None:
            why = f" ({ruled.gaps})" if ruled.gaps else ""
            raise KeyError(f"{ruled.op} has our rule (see `status`) but no sample suite{why}, so `validate` cannot run it; "
                           f"ops with suites: {names}")
        raise KeyError(f"unknown op {name!r}; known: {names}")
    raise KeyError(f"{name!r} is ambiguous: {', '.join(sorted(map(str, matches)))}")

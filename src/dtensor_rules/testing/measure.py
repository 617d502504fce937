"""Measure ours vs upstream per op on the running torch: the data ``install()`` decides from.

:func:`measure` validates both sides against ground truth (``check_samples``) for every op
with a sample suite, plus every out= / in-place overload we have a rule for whose functional
counterpart has one (samples built with ``aliasing.aliased_sample``), and runs the shard-order
probe (:func:`shard_order_probe`) for the layout-preserving ops. :func:`write` stores the result
as ``src/dtensor_rules/_upstream/measured_<major>_<minor>.json``; ``benchmarks/rule_coverage.py
--write-measured`` (``_upstream.measured.REGENERATE``) runs both; :func:`coverage_of` says whether
a file still covers the shipped rules.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch._ops import OpOverload
from torch.distributed.tensor.placement_types import Shard
from torch.utils._pytree import tree_map

from dtensor_rules import registry
from dtensor_rules._upstream.measured import measured_path
from dtensor_rules.testing.aliasing import aliased_sample, functional_counterpart
from dtensor_rules.testing.suites import Samples, samples_for, suites
from dtensor_rules.testing.validator import RuleReport, check_samples

__all__ = ["measured_ops", "contested_ops", "coverage_of", "Coverage", "op_samples", "measure_op", "shard_order_probe",
           "measure", "write"]

aten = torch.ops.aten
# ops whose rule exists to keep a DTensor's shard order (sample suites use default order only)
ORDER_PROBE_OPS = (aten.detach.default, aten.alias.default, aten.detach_.default)


def op_samples(op: OpOverload) -> Samples:
    """The op's suite, or its functional counterpart's suite turned into calls of ``op``."""
    table = suites()
    if op in table:
        return samples_for(op)
    func = functional_counterpart(op)
    if func is None or func not in table:
        raise KeyError(f"no sample suite for {op} or its functional counterpart")
    out: Samples = []
    for args, kwargs in samples_for(func):
        try:
            call = aliased_sample(op, tuple(args), dict(kwargs))
            trial = tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, call)
            op(*trial[0], **trial[1])  # e.g. an in-place op cannot change self's dtype: skip that sample
        except (RuntimeError, ValueError, TypeError):
            continue
        out.append(call)
    if not out:
        raise KeyError(f"no sample of {func}'s suite is a legal call of {op}")
    return out


def measured_ops() -> list[OpOverload]:
    """Every op we have a rule for that can be measured (own suite or counterpart's), sorted."""
    table = suites()
    ops = [op for op in registry.rules() if op in table or functional_counterpart(op) in table]
    return sorted(ops, key=str)


class Coverage(NamedTuple):
    """How a measured file's op set differs from what :func:`contested_ops` says it must hold."""

    missing: list[str]  # ops both sides have a rule for now, not in the file
    extra: list[str]  # ops in the file that are no longer contested (or no longer ours)


def contested_ops() -> list[OpOverload]:
    """The ops the running torch's measured file must hold: shipped, measurable, and upstream has a rule too
    (a rule a user registers in this process is never measured: it does not count)."""
    status, rules = registry.status(), registry.rules()
    return [op for op in measured_ops() if status[op]["has"] == "both" and registry.is_shipped(rules[op])]


def coverage_of(doc: dict[str, Any]) -> Coverage:
    """Compare a measured document's ops with :func:`contested_ops` (both empty: up to date)."""
    want = {str(op) for op in contested_ops()}
    have = set(doc["ops"])
    return Coverage(sorted(want - have), sorted(have - want))


def _side(report: Any) -> dict[str, int] | None:
    return report.counts() if report.has_rule else None


def measure_op(op: OpOverload, meshes: Sequence[Sequence[int]]) -> dict[str, Any]:
    """``{mesh: {"ours": counts, "upstream": counts | None, "valid": n}}`` (+ ``shard_order``)."""
    samples = op_samples(op)
    record: dict[str, Any] = {}
    for mesh in meshes:
        r: RuleReport = check_samples(op, samples, tuple(mesh))
        record["x".join(map(str, mesh))] = {"ours": _side(r.ours), "upstream": _side(r.upstream), "valid": r.valid}
    if op in ORDER_PROBE_OPS:
        record["shard_order"] = {side: shard_order_probe(op, side) for side in ("ours", "upstream")}
    return record


def shard_order_probe(op: OpOverload, side: str) -> str:
    """Run ``op`` on a (S(0), S(0)) DTensor sharded mesh-dim 1 first, with ``side``'s rule active.

    ``"kept"``: the output has the input's layout, values right, no collective; ``"lost"``: the
    layout changed or dispatch moved data; ``"wrong"``: the output's values are wrong.
    """
    from torch.distributed.tensor.debug import CommDebugMode

    from dtensor_rules._upstream import spec_of
    from dtensor_rules.redistribute import distribute_tensor, layout_of
    from dtensor_rules.testing import simulated_mesh
    from dtensor_rules.testing.dispatch import full_value

    x = torch.arange(15.0).reshape(5, 3)
    with registry.installed("override", [op]) if side == "ours" else _upstream_only(op):
        with simulated_mesh((2, 2)) as mesh:
            a = distribute_tensor(x, mesh, (Shard(0), Shard(0)), (1, 0))
            with CommDebugMode() as comm:
                out = op(a)
            moved = comm.get_total_counts() > 0
            same_layout = layout_of(spec_of(out)) == layout_of(spec_of(a))
            try:
                right = torch.equal(full_value(out), x)  # reads the output's metadata: wrong rows if it lied
            except AssertionError:  # the simulated ranks disagree
                right = False
    if not right:
        return "wrong"
    return "kept" if same_layout and not moved else "lost"


class _upstream_only:  # noqa: N801 - used like a context manager function
    """Our rule for one op uninstalled inside the block, reinstalled after if it was active."""

    def __init__(self, op: OpOverload) -> None:
        self.op, self.was = op, op in registry.active_ops()

    def __enter__(self) -> None:
        registry.uninstall([self.op])

    def __exit__(self, *exc: object) -> None:
        if self.was:
            registry.install("override", [self.op])


def measure(ops: Iterable[OpOverload], meshes: Sequence[Sequence[int]], command: str) -> dict[str, Any]:
    """The measured-data document for the running torch."""
    return {
        "torch": torch.__version__,
        "command": command,
        "meshes": ["x".join(map(str, m)) for m in meshes],
        "ops": {str(op): measure_op(op, meshes) for op in ops},
    }


def write(doc: dict[str, Any], path: Path | None = None) -> Path:
    """Write ``doc`` (sorted keys, one op per block) to the running torch's measured file."""
    path = path or measured_path()
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return path

"""install() keeps upstream's rule unless ours is MEASURED strictly better on the running torch.

The measured files (``src/dtensor_rules/_upstream/measured_<major>_<minor>.json``, written by
``python benchmarks/rule_coverage.py --write-measured``) are data; these tests check that the
running torch's file covers exactly the ops install() decides on (else: which command to run), that
the decision rule is right on synthetic records, that install()/status() follow the running
torch's file for every op both sides have a rule for, and that a part of the file still holds
when regenerated now.
"""

from __future__ import annotations

import pytest
import torch

import dtensor_rules
from dtensor_rules import registry
from dtensor_rules._upstream import TESTED_TORCH, TORCH_VERSION
from dtensor_rules._upstream.measured import REGENERATE, decide, load, verdict
from dtensor_rules.op_rules.fma import fma  # defines prims.fma (lazily registered rule)
from dtensor_rules.testing import measure

aten = torch.ops.aten


def _rec(ours: tuple[int, int] | None, up: tuple[int, int] | None, order: dict | None = None) -> dict:
    side = lambda c: None if c is None else {"correct": c[0], "incorrect": c[1], "missing": 0}  # noqa: E731
    rec = {"2": {"ours": side(ours), "upstream": side(up), "valid": 0}}
    if order:
        rec["shard_order"] = order
    return rec


@pytest.mark.parametrize(
    "record, keep, why",
    [
        (_rec((54, 0), (14, 2)), "ours", "ours: 54 correct vs upstream 14, upstream 2 incorrect"),
        (_rec((54, 0), (14, 0)), "ours", "ours: 54 correct vs upstream 14"),
        # correctness first: upstream's extra layouts do not make up for a wrong one
        (_rec((14, 0), (16, 5)), "ours", "ours: 14 correct vs upstream 16, upstream 5 incorrect"),
        (_rec((14, 0), (16, 0)), "upstream", "upstream kept: more correct (14 correct vs upstream 16)"),
        (_rec((17, 0), (17, 0)), "upstream", "upstream kept: equal coverage (17 correct each)"),
        (_rec((17, 1), (3, 0)), "upstream", "upstream kept: ours 1 incorrect (17 correct vs upstream 3)"),
        (_rec((17, 0), (17, 0), {"ours": "kept", "upstream": "lost"}), "ours",
         "ours: equal coverage (17 correct), upstream shard order lost, ours kept"),
        (_rec((17, 0), (17, 0), {"ours": "kept", "upstream": "kept"}), "upstream",
         "upstream kept: equal coverage (17 correct each)"),
        (_rec((5, 0), None), "ours", "ours: 5 correct, upstream had no rule when measured"),
        (None, "upstream", "upstream kept: not measured on torch 2.99"),
    ],
)
def test_decision_rule(record, keep, why):
    assert decide(record, "2.99") == (keep, why)


def test_meshes_are_summed_and_every_mesh_counts():
    record = _rec((10, 0), (10, 0))
    record["2x2"] = {"ours": {"correct": 40, "incorrect": 0, "missing": 0},
                     "upstream": {"correct": 12, "incorrect": 1, "missing": 0}, "valid": 40}
    assert decide(record) == ("ours", "ours: 50 correct vs upstream 22, upstream 1 incorrect")


def test_an_unmeasured_release_keeps_upstream():
    assert load((2, 99)) is None
    assert verdict(aten.cumsum.default, (2, 99)) == ("upstream", "upstream kept: torch 2.99 not measured")


def test_every_tested_release_has_a_measured_file():
    for version in TESTED_TORCH:
        doc = load(version)
        assert doc is not None, f"no measured file for torch {version}"
        assert doc["torch"].startswith(f"{version[0]}.{version[1]}.")
        assert doc["meshes"] == ["2"]


def test_measured_file_covers_exactly_the_contested_rules():
    """Adding, removing or renaming a shipped rule (or upstream gaining one) makes the file stale."""
    doc = load()
    assert doc is not None and doc["command"] == REGENERATE
    missing, extra = measure.coverage_of(doc)
    python = {(2, 13): ".venv/bin/python", (2, 14): ".venv-2.14.1/bin/python"}.get(TORCH_VERSION, "python")
    fix = (f"measured_{TORCH_VERSION[0]}_{TORCH_VERSION[1]}.json is stale: regenerate it with "
           f"`{REGENERATE.replace('python', python, 1)}` (torch {TORCH_VERSION[0]}.{TORCH_VERSION[1]}; "
           "run the same command with every tested release)")
    assert not missing and not extra, f"{fix}; not measured: {missing}; no longer contested: {extra}"


def test_coverage_check_notices_a_new_and_a_dropped_op():
    doc = load()
    fewer = {**doc, "ops": {k: v for k, v in doc["ops"].items() if k != "aten.cumsum.default"}}
    assert measure.coverage_of(fewer) == (["aten.cumsum.default"], [])
    more = {**doc, "ops": {**doc["ops"], "aten.no_such.default": {}}}
    assert measure.coverage_of(more) == ([], ["aten.no_such.default"])


def test_every_op_both_sides_rule_is_measured_and_install_follows_it():
    """status() on the running torch: where both have a rule, the active one is the measured verdict."""
    doc = load()
    assert doc is not None
    dtensor_rules.uninstall()  # a fresh default install (other tests in this process may have used other policies)
    dtensor_rules.install()
    both = {op: s for op, s in dtensor_rules.status().items() if s["has"] == "both"}
    assert both
    unmeasured = {op for op in both if str(op) not in doc["ops"]}
    # no sample suite reaches it (its functional counterpart _index_put_impl has none): upstream kept
    assert unmeasured <= {aten._index_put_impl_.default}
    for op, s in both.items():
        v = verdict(op)
        assert (s["active"], s["why"]) == (v.keep, v.why), op
        if op in unmeasured:
            assert v.keep == "upstream" and "not measured" in v.why
    for op, s in dtensor_rules.status().items():
        if s["has"] == "ours":
            assert (s["active"], s["why"]) == ("ours", "ours: upstream has no rule"), op


def test_override_and_fill_report_why():
    cumsum = aten.cumsum.default
    try:
        dtensor_rules.uninstall([cumsum])
        dtensor_rules.install("override", [cumsum])
        assert dtensor_rules.status()[cumsum] == {"has": "both", "active": "ours", "why": "ours: installed with policy='override'"}
        dtensor_rules.uninstall([cumsum])
        assert dtensor_rules.install("fill", [cumsum]) == []
        assert dtensor_rules.status()[cumsum]["active"] == "upstream"
    finally:
        dtensor_rules.uninstall([cumsum])
        dtensor_rules.install(ops=[cumsum])


# a cheap slice of the measured file, regenerated now on mesh 2: fma (pointwise, both sides
# single-dim), detach (+ the shard-order probe), softmax backward (op-strategy on 2.13)
REMEASURED = (fma, aten.detach.default, aten._softmax_backward_data.default)


@pytest.mark.parametrize("op", REMEASURED, ids=str)
def test_measured_file_still_holds(op):
    stored = load()["ops"][str(op)]
    fresh = measure.measure_op(op, [(2,)])
    assert fresh["2"] == stored["2"]
    assert fresh.get("shard_order") == stored.get("shard_order")

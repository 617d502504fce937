"""A user's torch.library custom op gets a rule through our registry and runs sharded."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import DTensor, distribute_tensor
from dtensor_rules._upstream import ShardingPlaceholder
from torch.distributed.tensor.placement_types import Partial, Replicate, Shard

import dtensor_rules
from dtensor_rules.testing import check_rule, simulated_mesh
from dtensor_rules.testing.dispatch import full_value, to_dtensor


@torch.library.custom_op("dtensor_rules_test::scaled_add", mutates_args=())
def scaled_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return 2 * x + y


@scaled_add.register_fake
def _(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


@dtensor_rules.register(scaled_add, flops=lambda x, y: 2 * x.numel())
def scaled_add_strategy(op, args, kwargs):
    """Pointwise per dim; linear, so Partial(sum) passes."""
    (x, _y) = args
    rows = [[ShardingPlaceholder(d)] * 3 for d in range(len(x.shape))]
    return rows + [[Partial("sum")] * 3]


OP = torch.ops.dtensor_rules_test.scaled_add.default


@pytest.fixture(autouse=True)
def _install_toy_rule():
    dtensor_rules.install(ops=[OP])
    yield
    dtensor_rules.uninstall(ops=[OP])


def test_custom_op_runs_sharded_without_communication():
    from torch.distributed.tensor.debug import CommDebugMode

    x, y = torch.randn(5, 4), torch.randn(5, 4)
    with simulated_mesh((2, 2)) as mesh:
        xd = to_dtensor(x, mesh, [Shard(0), Partial("sum")])
        yd = to_dtensor(y, mesh, [Shard(0), Partial("sum")])
        with CommDebugMode() as comm:
            out = scaled_add(xd, yd)
        assert comm.get_total_counts() == 0
        assert isinstance(out, DTensor) and out.placements == (Shard(0), Partial("sum"))
        torch.testing.assert_close(full_value(out), 2 * x + y)


def test_custom_op_rule_validates_against_ground_truth():
    report = check_rule(OP, (torch.randn(5, 4), torch.randn(5, 4)), mesh_shape=(2, 2))
    assert report.ours.incorrect == 0
    assert report.ours.correct > 0
    assert not report.upstream.has_rule


def test_uninstall_removes_the_custom_rule():
    dtensor_rules.uninstall(ops=[OP])
    with simulated_mesh(2) as mesh:
        x = distribute_tensor(torch.randn(4, 2), mesh, [Shard(0)])
        with pytest.raises(NotImplementedError, match="does not have a sharding strategy"):
            scaled_add(x, x)


def test_a_wrong_user_rule_is_caught_by_the_validator():
    """A rule claiming Partial(max) passes through 2*x+y is wrong (scaling is fine, adding y is not)."""

    def wrong(op, args, kwargs):
        return [[Partial("max")] * 3]

    dtensor_rules.register(OP, replace=True)(wrong)
    try:
        report = check_rule(OP, (torch.randn(4, 3), torch.randn(4, 3)), mesh_shape=(2,))
        assert report.ours.incorrect == 1
        assert report.ours.incorrect_combos == ["(P(max), P(max)) -> (P(max))"]
    finally:
        dtensor_rules.register(OP, replace=True)(scaled_add_strategy)


def test_report_check_refuses_a_vacuous_report_and_checks_a_replicate_only_claim():
    """custom_ops.md's check must not pass on "0 valid combos": `RuleReport.check` fails there, names
    why, and checks the Replicate-only claim when the rule states it."""
    from dtensor_rules.testing import RuleCheckError

    counts = torch.tensor([4, 0, 2, 3, 1, 0, 0, 5], dtype=torch.int32)
    permute = check_rule(torch.ops.dtensor_rules.moe_permute_indices.default, (counts, 4, 2, 40, 8), {}, (2,))
    assert permute.valid == 0 and permute.tried > 0 and permute.ours.incorrect == permute.ours.missing == 0
    with pytest.raises(RuleCheckError, match="0 valid combos of .* layouts tried.*replicate_only=True"):
        permute.check()
    permute.check(replicate_only=True)

    good = check_rule(OP, (torch.randn(4, 3), torch.randn(4, 3)), mesh_shape=(2,))
    good.check(complete=False)  # the toy rule leaves out valid P(avg)/P(max) rows
    with pytest.raises(RuleCheckError, match=r"misses \d+ valid layout\(s\): \(P\(avg\), P\(avg\)\) -> \(P\(avg\)\) \(sample float32"):
        good.check()
    with pytest.raises(RuleCheckError, match="declared Replicate-only, but ground truth accepts"):
        good.check(replicate_only=True)

    # a rule that offers nothing for an op with valid layouts: a Replicate-only claim that is false
    dtensor_rules.register(OP, replace=True)(lambda op, args, kwargs: [])
    try:
        empty = check_rule(OP, (torch.randn(4, 3), torch.randn(4, 3)), mesh_shape=(2,))
    finally:
        dtensor_rules.register(OP, replace=True)(scaled_add_strategy)
    with pytest.raises(RuleCheckError, match="misses"):
        empty.check()
    with pytest.raises(RuleCheckError, match="declared Replicate-only"):
        empty.check(replicate_only=True)
    empty.check(complete=False)  # offers nothing wrong; completeness not asked

    # nothing shardable (a 1-element bool tensor on 2 ranks: no Shard fits, no Partial for bool)
    tiny = check_rule(torch.ops.aten.logical_not.default, (torch.tensor([True]),), {}, (2,))
    assert tiny.tried == 0
    with pytest.raises(RuleCheckError, match="no sharded input layout could be tried"):
        tiny.check(replicate_only=True)

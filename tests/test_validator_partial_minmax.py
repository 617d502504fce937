"""The validator's Partial(max/min) simulation cannot accept an invalid row for a shift-invariant op.

``centered(x) = x - x.mean(-1)`` is linear and shift-invariant. Were the simulated P(max) parts
``x`` shifted by one constant per rank (as they were: each non-owner held ``x - big``), their
average would be ``x`` shifted by a constant too, and the invalid ``(P(max)) -> (P(avg))`` would
pass: ``avg_r centered(part_r) == centered(x)``. A real P(max) tensor's parts are anything
whose elementwise max is ``x``. Positive controls: the rows that are valid for this op, and
P(max)/P(min) passing through a monotone op, stay correct.
"""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor.placement_types import Partial, Shard

import dtensor_rules
from dtensor_rules import registry
from dtensor_rules.testing import check_rule
from dtensor_rules.testing.simulate import split_partial


@torch.library.custom_op("dtensor_rules_test::centered", mutates_args=())
def centered(x: torch.Tensor) -> torch.Tensor:
    return x - x.mean(-1, keepdim=True)


@torch.library.custom_op("dtensor_rules_test::leaky", mutates_args=())
def leaky(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x > 0, x, 0.1 * x)  # strictly increasing: max and min pass through


for _op in (centered, leaky):
    _op.register_fake(lambda x: torch.empty_like(x))

CENTERED = torch.ops.dtensor_rules_test.centered.default
LEAKY = torch.ops.dtensor_rules_test.leaky.default
MESHES = [(2,), (3,), (2, 2)]


def _check(op: torch._ops.OpOverload, rows: list[list], mesh: tuple[int, ...]):  # noqa: ANN202
    dtensor_rules.register(op, replace=True)(lambda _op, args, kwargs: rows)
    try:
        return check_rule(op, (torch.randn(4, 6, generator=torch.Generator().manual_seed(0)),), mesh_shape=mesh)
    finally:
        registry.unregister(op)


@pytest.mark.parametrize("mesh", MESHES, ids=str)
@pytest.mark.parametrize("reduce_op", ["max", "min"])
def test_partial_minmax_to_avg_is_rejected_for_a_shift_invariant_op(reduce_op: str, mesh: tuple[int, ...]) -> None:
    report = _check(CENTERED, [[Partial("avg"), Partial(reduce_op)]], mesh)
    assert report.ours.correct == 0 and report.ours.incorrect > 0, report.summary()
    assert f"(P({reduce_op})) -> (P(avg))" in report.ours.incorrect_combos or mesh != (2,), report.ours.incorrect_combos


@pytest.mark.parametrize("mesh", MESHES, ids=str)
def test_valid_rows_of_the_same_op_stay_correct(mesh: tuple[int, ...]) -> None:
    rows = [[Partial("sum"), Partial("sum")], [Partial("avg"), Partial("avg")], [Shard(0), Shard(0)]]
    report = _check(CENTERED, rows, mesh)
    assert report.ours.incorrect == 0 and report.ours.correct > 0, report.summary()


@pytest.mark.parametrize("mesh", MESHES, ids=str)
def test_minmax_through_a_monotone_op_stays_correct(mesh: tuple[int, ...]) -> None:
    report = _check(LEAKY, [[Partial("max"), Partial("max")], [Partial("min"), Partial("min")]], mesh)
    assert report.ours.incorrect == 0 and report.ours.correct > 0, report.summary()


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("reduce_op", ["max", "min"])
def test_minmax_parts_are_not_constant_shifts(reduce_op: str, n: int) -> None:
    """Neither one part nor the parts' mean is ``x`` plus a constant along the last dim."""
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(1))
    parts = torch.stack([split_partial(x, reduce_op, n, i, salt=5) for i in range(n)])
    reduced = parts.amax(0) if reduce_op == "max" else parts.amin(0)
    torch.testing.assert_close(reduced, x)
    for diff in (*(p - x for p in parts), parts.mean(0) - x):
        assert not bool(torch.isclose(diff, diff[:, :1]).all()), diff

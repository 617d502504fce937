"""The DTensor rule and cost formulas of dtensor_rules::moe_permute_indices."""

from __future__ import annotations

import pytest
import torch
from tests._moe_index_cases import Case, cases, oracle
from hypothesis import given
from hypothesis import strategies as st
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from dtensor_rules._upstream import ShardingPlaceholder

import dtensor_rules
from dtensor_rules import registry
from dtensor_rules.kernels import moe_permute_indices
from dtensor_rules.op_rules.moe_index import moe_permute_indices_strategy
from dtensor_rules.testing import check_rule, simulated_mesh

OP = torch.ops.dtensor_rules.moe_permute_indices.default


def small_case() -> st.SearchStrategy[Case]:
    return cases(max_experts=3, max_ranks=3, max_count=12)


def variants(case: Case) -> list[Case]:
    """The case plus same-shape variants: tight max_len (no room for larger counts) and all zeros.

    A rule must hold for every input, so a layout counts as valid only if the ground truth
    accepts it on all variants: one sample can make a layout valid by luck. With a single
    count (E = R = 1) Partial(min)/Partial(max) pieces that stay legal counts give valid
    results, but a Partial(min) piece can overflow a tight max_len and a Partial(max) piece
    of a zero count can be negative, so neither holds for every input.
    """
    a, E, R = case.alignment, case.experts_per_rank, case.num_ranks
    tight = Case(tuple(a * (x % 3 + 1) for x in case.counts), E, R, a, 0)
    plus = Case(tuple(x + 1 for x in case.counts), E, R, a, 0)
    zeros = Case((0,) * len(case.counts), E, R, a, case.slack)
    return [case, tight, plus, zeros]


@given(small_case(), st.sampled_from([(2,), (3,), (2, 2)]))
def test_rule_matches_ground_truth(case: Case, mesh_shape: tuple[int, ...]) -> None:
    missing: set[str] | None = None
    for v in variants(case):
        report = check_rule(OP, v.args(), {}, mesh_shape)
        assert report.ours.error is None
        assert report.ours.incorrect == 0, report.summary()
        found = set(report.ours.missing_combos)
        missing = found if missing is None else missing & found
    assert not missing, f"valid on every variant but not offered: {sorted(missing)}"


def test_validator_catches_a_wrong_rule_for_this_op() -> None:
    # negative control: claiming the counts may be sharded must be flagged, or the check above proves nothing
    rule = registry.get_rule(OP)

    def sharded(op, args, kwargs):  # type: ignore[no-untyped-def]
        return [[ShardingPlaceholder(0), Replicate(), Replicate(), ShardingPlaceholder(0)]]

    args = (torch.tensor([4, 0, 2, 3, 1, 0, 0, 5], dtype=torch.int32), 4, 2, 40, 8)
    registry.register(OP, replace=True)(sharded)
    try:
        report = check_rule(OP, args, {}, (2,))
    finally:
        registry.register_rule(rule, replace=True)
    assert report.ours.incorrect == 1, report.summary()
    assert registry.get_rule(OP).strategy is moe_permute_indices_strategy


def rank_values(t: DTensor) -> list[torch.Tensor]:
    """Every rank's local tensor (a plain tensor when the simulation keeps one copy for all ranks)."""
    local = t.to_local()
    return list(local._local_tensors.values()) if hasattr(local, "_local_tensors") else [local]


@pytest.mark.parametrize("mesh_shape", [(2,), (2, 2)])
@pytest.mark.parametrize("shard", [False, True])
def test_runs_under_dtensor_with_replicated_outputs(mesh_shape: tuple[int, ...], shard: bool) -> None:
    counts = torch.tensor([5, 0, 17, 1, 0, 2], dtype=torch.int32)  # 6 groups: uneven over 4 ranks
    want = oracle(tuple(counts.tolist()), 3, 2, 64, 16)
    with dtensor_rules.installed(), simulated_mesh(mesh_shape) as mesh:
        placements = [Shard(0) if shard else Replicate()] * len(mesh_shape)
        outs = moe_permute_indices(distribute_tensor(counts, mesh, placements), 3, 2, 64, 16)
        for out, expected in zip(outs, want):
            assert isinstance(out, DTensor)
            assert out.placements == (Replicate(),) * len(mesh_shape)
            assert all(v.tolist() == expected for v in rank_values(out))


def test_cost_formulas() -> None:
    rule = registry.get_rule(OP)
    counts = torch.tensor([4, 0, 2, 3, 1, 0, 0, 5], dtype=torch.int64)
    outs = moe_permute_indices(counts, 4, 2, 40, 8)
    moved = counts.nbytes + sum(o.nbytes for o in outs)  # read the input once, write each output once
    cost = rule.cost(OP, (counts, 4, 2, 40, 8), {})
    assert cost.bytes == moved == 8 * 8 + 4 * (40 + 4 + 4)
    assert cost.flops == 0  # integer index arithmetic only


def test_registered_as_ours_with_no_upstream_rule() -> None:
    assert registry.status()[OP] == {"has": "ours", "active": "ours", "why": "ours: upstream has no rule"}

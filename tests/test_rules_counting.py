"""histc / bincount rules: simulation on random inputs and arguments, suites vs upstream, DTensor end to end."""

from __future__ import annotations

import expecttest
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from dtensor_rules._upstream import DynamicOutputShapeException, ShardingPlaceholder
from torch.distributed.tensor.placement_types import Partial, Replicate, Shard

import dtensor_rules  # (installs the rules)
from dtensor_rules.testing.dispatch import full_value, to_dtensor
from dtensor_rules.registry import get_rule
from dtensor_rules.testing import check_rule, check_samples, simulated_mesh
from dtensor_rules.testing.query import tensor_meta
from dtensor_rules.testing.suites import samples_for
from dtensor_rules.testing.validator import _pstr

aten = torch.ops.aten
MESHES = [(2,), (4,), (2, 2), (2, 4), (2, 2, 2)]


def assert_ours_correct(op, args, kwargs, mesh) -> None:
    report = check_rule(op, args, kwargs, mesh)
    assert report.ours.error is None, report.summary()
    assert report.ours.incorrect == 0, report.summary()
@given(
    st.sampled_from(MESHES),
    st.lists(st.integers(0, 6), min_size=0, max_size=3),
    st.sampled_from([torch.float32, torch.bfloat16, torch.float64]),
    st.integers(1, 6),
    st.integers(0, 2**31 - 1),
    st.data(),
)
def test_histc_every_strategy_correct(mesh, shape, dtype, bins, seed, data) -> None:
    x = (torch.randn(tuple(shape), generator=torch.Generator().manual_seed(seed)) * 2).to(dtype)
    lo = data.draw(st.sampled_from([-2.0, -1.0, 0.0, 0.5, 2.0]))
    hi = lo if data.draw(st.booleans()) else lo + data.draw(st.sampled_from([0.25, 1.0, 3.0]))  # min == max: data range
    if data.draw(st.booleans()):
        args, kwargs = (x, bins, lo, hi), {}
    else:
        args, kwargs = (x,), {"bins": bins, "min": lo, "max": hi}
    assert_ours_correct(aten.histc.default, args, kwargs, mesh)
@given(
    st.sampled_from(MESHES),
    st.integers(0, 9),
    st.integers(0, 2**31 - 1),
    st.sampled_from([None, torch.float32, torch.float64, torch.bfloat16, torch.int64]),
    st.integers(0, 8),
)
def test_bincount_every_strategy_correct(mesh, n, seed, weight_dtype, minlength) -> None:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 7, (n,), generator=g)
    weights = None if weight_dtype is None else (torch.randn(n, generator=g) * 3).to(weight_dtype)
    assert_ours_correct(aten.bincount.default, (ids, weights, minlength), {}, mesh)


@pytest.mark.parametrize("mesh", [(2,), (4,), (2, 2)], ids=str)
@pytest.mark.parametrize("op", [aten.histc.default, aten.bincount.default], ids=str)
def test_suite_no_incorrect_and_at_least_upstream(op, mesh) -> None:
    report = check_samples(op, samples_for(op), mesh)
    assert report.ours.incorrect == 0, report.summary()
    assert report.ours.correct >= report.upstream.correct, report.summary()
    assert report.ours.correct > report.upstream.correct  # keyword min/max (histc), no rule (bincount)


def test_histc_min_equal_max_nonzero_is_replicate_only() -> None:
    """min == max != 0 means "use the data range"; upstream still offers S -> P(sum) (wrong)."""
    x = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    report = check_rule(aten.histc.default, (x, 4, 2, 2), {}, (2,))
    assert report.ours.correct == report.ours.incorrect == 0, report.summary()
    assert report.upstream.incorrect_combos == ["(S(0)) -> (P(sum))"], report.summary()


# ------------------------------------------------------------------ end to end through DTensor
def test_dtensor_histc_tokens_per_expert() -> None:
    expert_ids = torch.randint(0, 8, (9, 2), generator=torch.Generator().manual_seed(0)).float()
    with simulated_mesh((2, 2)) as mesh:
        counts = torch.histc(to_dtensor(expert_ids, mesh, [Shard(0), Shard(1)]), bins=8, min=0, max=7)
        got = counts.placements, full_value(counts)
    assert got[0] == (Partial("sum"), Partial("sum"))  # no all-gather of the ids
    torch.testing.assert_close(got[1], torch.histc(expert_ids, 8, 0, 7))


@pytest.mark.parametrize("lo_hi", [(0, 0), (2, 2)], ids=str)
def test_dtensor_histc_data_range_matches_single_device(lo_hi) -> None:
    x = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 2.5])
    with simulated_mesh((2,)) as mesh:
        counts = torch.histc(to_dtensor(x, mesh, [Shard(0)]), 4, *lo_hi)
        got = counts.placements, full_value(counts)
    assert got[0] == (Replicate(),)
    torch.testing.assert_close(got[1], torch.histc(x, 4, *lo_hi))


def test_dtensor_histc_bf16_beyond_exact_counts_is_not_partial() -> None:
    """300 equal bf16 values: counts past 256 are not exact in bf16, so no P(sum) is offered."""
    x = torch.zeros(300, dtype=torch.bfloat16)
    with simulated_mesh((2,)) as mesh:
        counts = torch.histc(to_dtensor(x, mesh, [Shard(0)]), 1, -1, 1)
        got = counts.placements, full_value(counts)
    assert got[0] == (Replicate(),)
    torch.testing.assert_close(got[1], torch.histc(x, 1, -1, 1))


def test_dtensor_bincount_is_blocked_upstream() -> None:
    """Upstream limitation our handler lifts: DTensor computes output metadata on fake tensors,
    which cannot give bincount's data-dependent shape."""
    ids = torch.tensor([0, 3, 1, 1, 2])
    dtensor_rules.uninstall([aten.bincount.default])
    try:
        with simulated_mesh((2,)) as mesh, pytest.raises(RuntimeError) as info:
            torch.bincount(to_dtensor(ids, mesh, [Replicate()]))
    finally:
        dtensor_rules.install(ops=[aten.bincount.default])
    assert isinstance(info.value.__cause__, DynamicOutputShapeException), info.value
    assert aten.bincount.default in dtensor_rules.registry.active_ops()


_BC_LAYOUTS = [  # (mesh, self, weights, expected result placements)
    ((3,), [Replicate()], [Partial("sum")], (Partial("sum"),)),
    ((3,), [Replicate()], [Partial("avg")], (Partial("avg"),)),
    ((3,), [Shard(0)], [Partial("sum")], (Partial("sum"),)),  # self gathered, weights stay Partial
    ((3,), [Shard(0)], [Shard(0)], (Replicate(),)),
    ((3,), [Replicate()], None, (Replicate(),)),
    ((2, 3), [Replicate(), Shard(0)], [Partial("sum"), Partial("avg")], (Partial("sum"), Partial("avg"))),
    ((2, 3), [Shard(0), Replicate()], [Replicate(), Partial("sum")], (Replicate(), Partial("sum"))),
    ((2, 3), [Shard(0), Shard(0)], [Shard(0), Replicate()], (Replicate(), Replicate())),
]


@pytest.mark.parametrize("mesh_shape, self_pl, w_pl, expected", _BC_LAYOUTS, ids=str)
@pytest.mark.parametrize("minlength", [0, 9])
def test_dtensor_bincount_end_to_end(mesh_shape, self_pl, w_pl, expected, minlength) -> None:
    """bincount runs through DTensor on uneven meshes (7 ids over 3 ranks): the rule's cheapest
    strategy is chosen, Partial weights stay Partial, values equal single-device."""
    g = torch.Generator().manual_seed(len(mesh_shape) + minlength)
    ids, w = torch.randint(0, 6, (7,), generator=g), torch.rand(7, generator=g, dtype=torch.float64)
    with simulated_mesh(mesh_shape) as mesh:
        dids = to_dtensor(ids, mesh, self_pl, salt=1)
        if w_pl is None:
            out, want = torch.bincount(dids, minlength=minlength), torch.bincount(ids, minlength=minlength)
        else:
            dw = to_dtensor(w, mesh, w_pl, salt=2)
            out, want = torch.bincount(dids, dw, minlength=minlength), torch.bincount(ids, w, minlength=minlength)
        assert tuple(out.placements) == expected
        assert out.shape == want.shape
        torch.testing.assert_close(full_value(out), want)


def test_dtensor_bincount_out_follows_the_out_tensor() -> None:
    ids, w = torch.tensor([0, 3, 1, 1, 2]), torch.rand(5)
    with simulated_mesh((2,)) as mesh:
        dids, dw = to_dtensor(ids, mesh, [Replicate()]), to_dtensor(w, mesh, [Partial("sum")], salt=2)
        for out_pl in ([Partial("sum")], [Replicate()]):
            out = to_dtensor(torch.empty(4), mesh, out_pl)
            res = aten.bincount.out(dids, dw, out=out)
            assert res is out and tuple(out.placements) == tuple(out_pl)
            torch.testing.assert_close(full_value(out), torch.bincount(ids, w))
        with pytest.raises(RuntimeError, match="offers no output laid out like the out= tensor"):
            aten.bincount.out(dids, dw, out=to_dtensor(torch.empty(4), mesh, [Shard(0)]))
        with pytest.raises(RuntimeError, match="out= tensor cannot be resized, pass one like the result"):
            aten.bincount.out(dids, dw, out=to_dtensor(torch.empty(0), mesh, [Replicate()]))


def test_dtensor_bincount_mixed_with_plain_tensor_names_the_fix() -> None:
    with simulated_mesh((2,)) as mesh, pytest.raises(RuntimeError, match="make every tensor argument a DTensor"):
        torch.bincount(to_dtensor(torch.tensor([0, 1]), mesh, [Replicate()]), torch.rand(2))


# ------------------------------------------------------------------ pinned strategy tables
def rows(op, args, kwargs=None) -> str:
    meta = lambda v: tensor_meta(v) if isinstance(v, torch.Tensor) else v  # noqa: E731
    args_meta = tuple(meta(a) for a in args)
    kwargs_meta = {k: meta(v) for k, v in (kwargs or {}).items()}
    fmt = lambda p: f"S({p.dim})" if isinstance(p, ShardingPlaceholder) else _pstr(p)  # noqa: E731
    return "\n".join(", ".join(map(fmt, r)) for r in get_rule(op).strategy(op, args_meta, kwargs_meta)) or "(R only)"


class TestTables(expecttest.TestCase):
    def test_histc_fixed_range(self) -> None:
        self.assertExpectedInline(rows(aten.histc.default, (torch.randn(3, 4), 8, 0, 7)), """\
P(sum), S(0)
P(sum), S(1)""")

    def test_histc_by_keyword(self) -> None:
        self.assertExpectedInline(rows(aten.histc.default, (torch.randn(5),), {"min": -1, "max": 1}), """P(sum), S(0)""")

    def test_histc_data_range(self) -> None:
        self.assertExpectedInline(rows(aten.histc.default, (torch.randn(3, 4), 8, 2, 2)), """(R only)""")

    def test_histc_bf16_too_many_elements(self) -> None:
        self.assertExpectedInline(rows(aten.histc.default, (torch.randn(257).bfloat16(), 8, 0, 1)), """(R only)""")

    def test_histc_out(self) -> None:
        self.assertExpectedInline(rows(aten.histc.out, (torch.randn(3, 4), 8, 0, 7), {"out": torch.empty(8)}), """\
P(sum), S(0), P(sum)
P(sum), S(1), P(sum)""")

    def test_bincount_no_weights(self) -> None:
        self.assertExpectedInline(rows(aten.bincount.default, (torch.tensor([0, 2]),)), """(R only)""")

    def test_bincount_float_weights(self) -> None:
        self.assertExpectedInline(rows(aten.bincount.default, (torch.tensor([0, 2]), torch.ones(2))), """\
P(sum), R, P(sum)
P(avg), R, P(avg)""")

    def test_bincount_bf16_weights_counted_in_float64(self) -> None:
        self.assertExpectedInline(rows(aten.bincount.default, (torch.tensor([0, 2]), torch.ones(2).bfloat16())), """(R only)""")

    def test_bincount_out_weights_by_keyword(self) -> None:
        kwargs = {"weights": torch.ones(2), "out": torch.empty(3)}
        self.assertExpectedInline(rows(aten.bincount.out, (torch.tensor([0, 2]),), kwargs), """\
P(sum), R, P(sum), P(sum)
P(avg), R, P(avg), P(avg)""")

"""sort / argsort / topk rules: validated by simulation on random inputs, end to end, and pinned tables.

Index equality is asserted (the validator compares every output exactly for integer dtypes), so
unstable sorts and topk get DISTINCT values (ties make the order of equal elements
implementation-defined); stable sorts get many ties on purpose.
"""

from __future__ import annotations

import math

import expecttest
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.distributed.tensor.placement_types import Replicate, Shard

import dtensor_rules  # noqa: F401  (installs the rules)
from dtensor_rules.testing.dispatch import full_value, to_dtensor
from dtensor_rules.registry import get_rule
from dtensor_rules.testing import check_rule, check_samples, simulated_mesh
from dtensor_rules.testing.mesh import fake_world
from dtensor_rules.testing.query import emitted_combos, tensor_meta
from dtensor_rules.testing.simulate import Sample
from dtensor_rules.testing.suites import samples_for
from dtensor_rules.testing.validator import _pstr, format_combo

aten = torch.ops.aten
MESHES = [(2,), (4,), (2, 2), (2, 4), (2, 2, 2)]
DTYPES = [torch.float32, torch.bfloat16, torch.int64]


@st.composite
def inputs(draw: st.DrawFn, ties: bool) -> torch.Tensor:
    shape = tuple(draw(st.lists(st.integers(0, 6), min_size=0, max_size=3)))
    dtype = draw(st.sampled_from(DTYPES))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    n = math.prod(shape)
    if ties:
        x = torch.randint(-1, 2, shape, generator=g)
    else:  # distinct values, exactly representable in bf16 (n <= 216)
        x = torch.randperm(n, generator=g).reshape(shape) - n // 2
    return x.to(dtype)


def dims(x: torch.Tensor) -> st.SearchStrategy[int]:
    nd = max(x.ndim, 1)
    return st.integers(-nd, nd - 1)


def assert_ours_correct(op, args, kwargs, mesh) -> None:
    report = check_rule(op, args, kwargs, mesh)
    assert report.ours.error is None, report.summary()
    assert report.ours.incorrect == 0, report.summary()
@given(st.sampled_from(MESHES), inputs(ties=False), st.data())
def test_sort_default_every_strategy_correct(mesh, x, data) -> None:
    args = (x, data.draw(dims(x)), data.draw(st.booleans()))
    assert_ours_correct(aten.sort.default, args, {}, mesh)
@given(st.sampled_from(MESHES), inputs(ties=True), st.data())
def test_sort_stable_with_ties_every_strategy_correct(mesh, x, data) -> None:
    kwargs = {"stable": True, "dim": data.draw(dims(x)), "descending": data.draw(st.booleans())}
    assert_ours_correct(aten.sort.stable, (x,), kwargs, mesh)
@given(st.sampled_from(MESHES), inputs(ties=True), st.data())
def test_argsort_stable_with_ties_every_strategy_correct(mesh, x, data) -> None:
    kwargs = {"stable": True, "dim": data.draw(dims(x)), "descending": data.draw(st.booleans())}
    assert_ours_correct(aten.argsort.stable, (x,), kwargs, mesh)
@given(st.sampled_from(MESHES), inputs(ties=False), st.data())
def test_argsort_default_every_strategy_correct(mesh, x, data) -> None:
    assert_ours_correct(aten.argsort.default, (x, data.draw(dims(x)), data.draw(st.booleans())), {}, mesh)
@given(st.sampled_from(MESHES), inputs(ties=False), st.data())
def test_topk_every_strategy_correct(mesh, x, data) -> None:
    dim = data.draw(dims(x))
    size = x.shape[dim] if x.ndim else 1
    k = data.draw(st.integers(0, size))
    largest, sorted_ = data.draw(st.booleans()), data.draw(st.booleans())
    if data.draw(st.booleans()):
        args, kwargs = (x, k), {"dim": dim, "largest": largest, "sorted": sorted_}  # by keyword
    else:
        args, kwargs = (x, k, dim, largest, sorted_), {}
    assert_ours_correct(aten.topk.default, args, kwargs, mesh)


@pytest.mark.parametrize("mesh", [(2,), (4,), (2, 2)], ids=str)
@pytest.mark.parametrize(
    "op",
    [aten.sort.default, aten.sort.stable, aten.argsort.default, aten.argsort.stable, aten.topk.default],
    ids=str,
)
def test_suite_no_incorrect_and_at_least_upstream(op, mesh) -> None:
    report = check_samples(op, samples_for(op), mesh)
    assert report.ours.incorrect == 0, report.summary()
    assert report.ours.correct >= report.upstream.correct, report.summary()


def test_topk_dim_by_keyword_is_not_read_as_last_dim() -> None:
    """Upstream treats topk(x, k, dim=0) as dim=-1 and shards dim 0; ours must not."""
    x = torch.randperm(20).reshape(5, 4).float()
    report = check_rule(aten.topk.default, (x, 2), {"dim": 0}, (2,))
    assert report.ours.incorrect == 0 and report.ours.missing == 0, report.summary()
    assert report.upstream.incorrect_combos == ["(S(0)) -> (S(0), S(0))"], report.summary()


# ------------------------------------------------------------------ end to end through DTensor
def test_dtensor_topk_router_matches_single_device() -> None:
    scores = torch.randn(7, 8, generator=torch.Generator().manual_seed(0)).softmax(-1)
    with simulated_mesh((2, 2)) as mesh:
        d = to_dtensor(scores, mesh, [Shard(0), Replicate()])
        values, indices = torch.topk(d, 2, dim=-1)
        got = (values.placements, full_value(values), full_value(indices))
    expected = torch.topk(scores, 2, dim=-1)
    assert got[0] == (Shard(0), Replicate())  # sharded over tokens: no communication
    torch.testing.assert_close(got[1], expected.values)
    torch.testing.assert_close(got[2], expected.indices)


def test_dtensor_sort_of_sorted_dim_shard_is_redistributed() -> None:
    x = torch.randperm(30).reshape(6, 5).float()
    with simulated_mesh((2,)) as mesh:
        d = to_dtensor(x, mesh, [Shard(1)])
        values, indices = torch.sort(d, dim=1, descending=True)
        got = full_value(values), full_value(indices)
    expected = torch.sort(x, dim=1, descending=True)
    torch.testing.assert_close(got[0], expected.values)
    torch.testing.assert_close(got[1], expected.indices)


def test_dtensor_argsort_stable_token_permutation() -> None:
    expert_ids = torch.randint(0, 4, (9, 3), generator=torch.Generator().manual_seed(1))
    with simulated_mesh((2,)) as mesh:
        d = to_dtensor(expert_ids, mesh, [Shard(1)])
        perm = torch.argsort(d, dim=0, stable=True)
        got = perm.placements, full_value(perm)
    assert got[0] == (Shard(1),)
    torch.testing.assert_close(got[1], torch.argsort(expert_ids, dim=0, stable=True))


def test_dtensor_argsort_under_inference_mode_uses_the_argsort_rule(monkeypatch) -> None:
    """Under inference mode DTensor dispatches argsort itself (not its sort decomposition)."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache

    prop = DTensor._op_dispatcher.sharding_propagator
    installed = prop.op_strategy_funcs[aten.argsort.stable]  # our single-dim rule, installed as an op strategy
    calls = []

    def counting(op_schema):
        calls.append(op_schema.op)
        return installed(op_schema)

    monkeypatch.setitem(prop.op_strategy_funcs, aten.argsort.stable, counting)
    _clear_sharding_prop_cache()
    expert_ids = torch.randint(0, 4, (9, 3), generator=torch.Generator().manual_seed(1))
    with simulated_mesh((2,)) as mesh, torch.inference_mode():
        perm = torch.argsort(to_dtensor(expert_ids, mesh, [Shard(1)]), dim=0, stable=True)
        got = perm.placements, full_value(perm)
    _clear_sharding_prop_cache()
    assert calls == [aten.argsort.stable]
    assert got[0] == (Shard(1),)
    torch.testing.assert_close(got[1], torch.argsort(expert_ids, dim=0, stable=True))


def test_dtensor_sort_out_variant() -> None:
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(2))
    with simulated_mesh((2,)) as mesh:
        d = to_dtensor(x, mesh, [Shard(0)])
        values = to_dtensor(torch.empty(5, 4), mesh, [Shard(0)])
        indices = to_dtensor(torch.empty(5, 4, dtype=torch.long), mesh, [Shard(0)])
        torch.sort(d, 1, out=(values, indices))
        got = full_value(values), full_value(indices)
    expected = torch.sort(x, 1)
    torch.testing.assert_close(got[0], expected.values)
    torch.testing.assert_close(got[1], expected.indices)


@pytest.mark.parametrize("which", ["sort", "topk"])
def test_dtensor_backward_matches_single_device(which: str) -> None:
    """Backward of sort / topk is new_zeros + scatter.src along ``dim`` (upstream's scatter rule)."""
    x = torch.randperm(24).reshape(6, 4).float()
    fwd = (lambda t: torch.sort(t, dim=1).values) if which == "sort" else (lambda t: torch.topk(t, 2, dim=1).values)
    ref = x.clone().requires_grad_()
    (fwd(ref) ** 2).sum().backward()
    with simulated_mesh((2,)) as mesh:
        d = to_dtensor(x, mesh, [Shard(0)]).requires_grad_()
        (fwd(d) ** 2).sum().backward()
        got = d.grad.placements, full_value(d.grad)
    assert got[0] == (Shard(0),)
    torch.testing.assert_close(got[1], ref.grad)


def test_dtensor_bad_dim_is_an_index_error_like_single_device() -> None:
    x = torch.randn(4, 3)
    with pytest.raises(IndexError):
        torch.sort(x, dim=5)
    with simulated_mesh((2,)) as mesh, pytest.raises(RuntimeError) as info:
        torch.sort(to_dtensor(x, mesh, [Shard(0)]), dim=5)
    assert isinstance(info.value.__cause__, IndexError), info.value
    assert "dim 5 out of range for a 2-d tensor" in str(info.value)


# ------------------------------------------------------------------ pinned strategy tables
def _metas(sample: Sample):
    from torch.utils import _pytree as pytree

    return pytree.tree_map(lambda x: tensor_meta(x) if isinstance(x, torch.Tensor) else x, (sample.args, sample.kwargs))


def _placement_str(p) -> str:
    from dtensor_rules._upstream import ShardingPlaceholder

    if isinstance(p, ShardingPlaceholder):
        return f"S({p.dim})"
    return _pstr(p)

def table(op, args, kwargs=None, mesh_shape=(2,)) -> str:
    with fake_world(math.prod(mesh_shape)):
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", mesh_shape)
        combos = emitted_combos("single_dim", get_rule(op).strategy, op, Sample(tuple(args), dict(kwargs or {})), mesh)
    return "\n".join(sorted(map(format_combo, combos)))


def rows(op, args, kwargs=None) -> str:
    """The rule's own single-mesh-dim rows, one per line."""
    args_meta, kwargs_meta = _metas(Sample(tuple(args), dict(kwargs or {})))
    return "\n".join(", ".join(_placement_str(p) for p in r) for r in get_rule(op).strategy(op, args_meta, kwargs_meta))


class TestTables(expecttest.TestCase):
    def test_sort_table(self) -> None:
        self.assertExpectedInline(table(aten.sort.default, (torch.randn(3, 4, 5), 1)), """\
(R) -> (R, R)
(S(0)) -> (S(0), S(0))
(S(2)) -> (S(2), S(2))""")

    def test_sort_stable_table(self) -> None:
        self.assertExpectedInline(table(aten.sort.stable, (torch.randn(3, 4),), {"stable": True, "dim": 0}), """\
(R) -> (R, R)
(S(1)) -> (S(1), S(1))""")

    def test_argsort_table(self) -> None:
        self.assertExpectedInline(table(aten.argsort.stable, (torch.randn(3, 4),), {"stable": True}), """\
(R) -> (R)
(S(0)) -> (S(0))""")

    def test_topk_table_2d_mesh(self) -> None:
        self.assertExpectedInline(table(aten.topk.default, (torch.randn(4, 6), 2), {"dim": 0}, (2, 2)), """\
(RR) -> (RR, RR)
(RS(1)) -> (RS(1), RS(1))
(S(1)R) -> (S(1)R, S(1)R)
(S(1)S(1)) -> (S(1)S(1), S(1)S(1))""")

    def test_sort_values_out_rows(self) -> None:
        """Out variants: the raw per-mesh-dim rows ([values, indices, self, values=, indices=])."""
        out = {"values": torch.empty(3, 4), "indices": torch.empty(3, 4, dtype=torch.long)}
        self.assertExpectedInline(rows(aten.sort.values, (torch.randn(3, 4), 1), out), """S(0), S(0), S(0), S(0), S(0)""")

    def test_topk_values_out_rows(self) -> None:
        out = {"indices": torch.empty(0, dtype=torch.long), "values": torch.empty(0)}  # kwargs order kept
        self.assertExpectedInline(rows(aten.topk.values, (torch.randn(3, 4, 2), 2, 1), out), """\
S(0), S(0), S(0), S(0), S(0)
S(2), S(2), S(2), S(2), S(2)""")

"""gather / scatter_add / scatter / scatter_reduce rules: every emitted strategy reproduces torch."""

from __future__ import annotations

import pytest

import torch
from expecttest import TestCase
from hypothesis import given
from hypothesis import strategies as st
from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

import dtensor_rules  # noqa: F401  (installs the rules)
from dtensor_rules.op_rules.gather_scatter import GATHER, SCATTER_ADD, SCATTER_REDUCE, SCATTER_SRC, SCATTER_VALUE
from dtensor_rules.testing import check_rule, check_samples, simulated_mesh
from dtensor_rules.testing import strategies as dst
from dtensor_rules.testing.dispatch import to_dtensor
from dtensor_rules.testing.suites import samples_for
from dtensor_rules.testing.tables import strategy_table

aten = torch.ops.aten
MESHES = [(2,), (4,), (2, 2), (2, 4), (2, 2, 2)]


def assert_no_incorrect(op, args, kwargs, mesh):  # noqa: ANN001, ANN201
    report = check_rule(op, args, kwargs, mesh, max_nd_combos=150)
    assert report.ours.error is None, report.ours.error
    assert report.ours.incorrect == 0, report.summary()
    return report






@st.composite
def indexed_call(draw, with_src: bool):  # noqa: ANN001, ANN201
    """(mesh, self, dim, index, src): index <= self on dims != dim, index <= src everywhere,
    sizes often equal (so sharding is offered) and often not (so it must not be)."""
    mesh = draw(st.sampled_from(MESHES))
    ndim = draw(st.integers(1, 3))
    self_shape = list(draw(dst.shapes(ndim, ndim, 1, 6)))
    dim = draw(st.integers(-ndim, ndim - 1))
    d = dim % ndim
    index_shape = [draw(st.sampled_from([s, s, max(1, s - 1), 0 if i != d else s])) for i, s in enumerate(self_shape)]
    index_shape[d] = draw(st.integers(0, 7))
    src_shape = [s + draw(st.sampled_from([0, 0, 1])) for s in index_shape]
    dtype = draw(st.sampled_from((torch.float32, torch.bfloat16, torch.int64)))
    self_t = draw(dst.tensors(self_shape, dtype))
    seed = draw(st.integers(0, 2**20))
    index = torch.randint(0, self_shape[d], tuple(index_shape), generator=torch.Generator().manual_seed(seed))
    src = draw(dst.tensors(src_shape, dtype)) if with_src else None
    return mesh, self_t, dim, index, src


@pytest.mark.slow  # every emitted strategy against the ground truth
@given(indexed_call(with_src=False))
def test_gather_every_emitted_strategy_is_correct(call) -> None:  # noqa: ANN001
    mesh, self_t, dim, index, _ = call
    assert_no_incorrect(aten.gather.default, (self_t, dim, index), {}, mesh)


@pytest.mark.slow  # over ~9 s of the inner loop (pyproject.toml)
@given(indexed_call(with_src=True))
def test_scatter_add_every_emitted_strategy_is_correct(call) -> None:  # noqa: ANN001
    mesh, self_t, dim, index, src = call
    assert_no_incorrect(aten.scatter_add.default, (self_t, dim, index, src), {}, mesh)


@pytest.mark.slow  # ~13 s: every emitted strategy of five reduce modes
@given(indexed_call(with_src=True), st.sampled_from(["sum", "mean", "amax", "amin", "prod"]), st.booleans())
def test_scatter_reduce_every_emitted_strategy_is_correct(call, reduce, include_self) -> None:  # noqa: ANN001
    mesh, self_t, dim, index, src = call
    args = (self_t, dim, index, src, reduce)
    assert_no_incorrect(aten.scatter_reduce.two, args, {"include_self": include_self}, mesh)


@pytest.mark.slow  # every emitted strategy against the ground truth
@given(indexed_call(with_src=False), st.sampled_from([0, 0.0, 1.5, -2]))
def test_scatter_value_every_emitted_strategy_is_correct(call, value) -> None:  # noqa: ANN001
    mesh, self_t, dim, index, _ = call
    if not self_t.is_floating_point():
        value = int(value)
    assert_no_incorrect(aten.scatter.value, (self_t, dim, index, value), {}, mesh)


@pytest.mark.slow  # over ~9 s of the inner loop (pyproject.toml)
def test_suites_ours_correct_and_at_least_upstream() -> None:
    for op in (GATHER[0], SCATTER_ADD[0], SCATTER_SRC[0], SCATTER_VALUE[0], SCATTER_REDUCE[0]):
        report = check_samples(op, samples_for(op), (2,))
        assert report.ours.incorrect == 0, report.summary()
        assert report.ours.correct >= report.upstream.correct, report.summary()


def test_scatter_add_index_sharded_sums_partial_end_to_end() -> None:
    """The MoE combine: rows of src (and their indices) sharded, the result P(sum)."""
    self_t, src = torch.zeros(5, 4), torch.randn(9, 4)
    index = torch.randint(0, 5, (9, 4))
    with simulated_mesh((2,)) as mesh:
        dself = to_dtensor(self_t, mesh, [Partial("sum")])
        dindex = distribute_tensor(index, mesh, [Shard(0)])
        dsrc = distribute_tensor(src, mesh, [Shard(0)])
        out = torch.scatter_add(dself, 0, dindex, dsrc)
        assert tuple(out.placements) == (Partial("sum"),)
        torch.testing.assert_close(out.full_tensor(), torch.scatter_add(self_t, 0, index, src))


def test_scatter_add_inplace_end_to_end() -> None:
    self_t, src, index = torch.randn(6, 4), torch.randn(3, 4), torch.randint(0, 4, (6, 2))
    expected = self_t.clone().scatter_add_(1, index, src[:, :2].repeat(2, 1))
    with simulated_mesh((2, 2)) as mesh:
        dself = distribute_tensor(self_t, mesh, [Shard(0), Replicate()])
        dindex = distribute_tensor(index, mesh, [Shard(0), Replicate()])
        dsrc = distribute_tensor(src[:, :2].repeat(2, 1), mesh, [Shard(0), Replicate()])
        dself.scatter_add_(1, dindex, dsrc)
        assert tuple(dself.placements) == (Shard(0), Replicate())
        torch.testing.assert_close(dself.full_tensor(), expected)


def test_gather_partial_max_self_end_to_end() -> None:
    x, index = torch.randn(4, 7), torch.randint(0, 7, (4, 3))
    with simulated_mesh((2,)) as mesh:
        dx = to_dtensor(x, mesh, [Partial("max")])
        out = torch.gather(dx, 1, distribute_tensor(index, mesh, [Replicate()]))
        assert tuple(out.placements) == (Partial("max"),)
        torch.testing.assert_close(out.full_tensor(), torch.gather(x, 1, index))


def test_gather_index_smaller_than_self_is_not_sharded_wrongly_end_to_end() -> None:
    x, index = torch.randn(5, 6), torch.randint(0, 6, (3, 2))
    with simulated_mesh((2,)) as mesh:
        out = torch.gather(distribute_tensor(x, mesh, [Shard(0)]), 1, distribute_tensor(index, mesh, [Shard(0)]))
        torch.testing.assert_close(out.full_tensor(), torch.gather(x, 1, index))


def test_gather_backward_end_to_end() -> None:
    """gather's backward runs new_zeros + scatter_add on DTensor."""
    x, index = torch.randn(6, 5), torch.randint(0, 5, (6, 3))
    ref = x.clone().requires_grad_()
    (torch.gather(ref, 1, index) ** 2).sum().backward()
    with simulated_mesh((2, 2)) as mesh:
        dx = distribute_tensor(x, mesh, [Shard(0), Replicate()]).requires_grad_()
        dindex = distribute_tensor(index, mesh, [Shard(0), Replicate()])
        (torch.gather(dx, 1, dindex) ** 2).sum().backward()
        torch.testing.assert_close(dx.grad.full_tensor(), ref.grad)


def test_scatter_backward_end_to_end() -> None:
    """scatter_add's backward runs gather (src) and passes grad through (self)."""
    x, src, index = torch.randn(6, 5), torch.randn(6, 3), torch.randint(0, 5, (6, 3))
    rx, rsrc = x.clone().requires_grad_(), src.clone().requires_grad_()
    (torch.scatter_add(rx, 1, index, rsrc) ** 2).sum().backward()
    with simulated_mesh((2,)) as mesh:
        dx = distribute_tensor(x, mesh, [Shard(0)]).requires_grad_()
        dsrc = distribute_tensor(src, mesh, [Shard(0)]).requires_grad_()
        (torch.scatter_add(dx, 1, distribute_tensor(index, mesh, [Shard(0)]), dsrc) ** 2).sum().backward()
        torch.testing.assert_close(dx.grad.full_tensor(), rx.grad)
        torch.testing.assert_close(dsrc.grad.full_tensor(), rsrc.grad)


class GoldenTables(TestCase):
    def test_gather_table(self) -> None:
        self.assertExpectedInline(strategy_table(aten.gather.default, (torch.randn(4, 6), 1, torch.randint(0, 6, (4, 3)))), """\
(P(avg), R) -> (P(avg))
(P(max), R) -> (P(max))
(P(min), R) -> (P(min))
(P(sum), R) -> (P(sum))
(R, R) -> (R)
(R, S(1)) -> (S(1))
(S(0), S(0)) -> (S(0))
(S(1), M(1)) -> (M(1))""")

    def test_scatter_add_table(self) -> None:
        args = (torch.randn(4, 6), 0, torch.randint(0, 4, (5, 6)), torch.randn(5, 6))
        self.assertExpectedInline(strategy_table(aten.scatter_add.default, args), """\
(P(avg), R, P(avg)) -> (P(avg))
(P(avg), R, R) -> (P(avg))
(P(max), R, R) -> (P(max))
(P(min), R, R) -> (P(min))
(P(sum), R, P(sum)) -> (P(sum))
(P(sum), S(0), S(0)) -> (P(sum))
(R, R, P(avg)) -> (P(avg))
(R, R, R) -> (R)
(S(1), S(1), S(1)) -> (S(1))""")

    def test_scatter_src_table(self) -> None:
        args = (torch.randn(4, 6), 1, torch.randint(0, 6, (4, 3)), torch.randn(4, 5))
        self.assertExpectedInline(strategy_table(aten.scatter.src, args), """\
(P(avg), R, P(avg)) -> (P(avg))
(P(avg), R, R) -> (P(avg))
(P(max), R, P(max)) -> (P(max))
(P(max), R, R) -> (P(max))
(P(min), R, P(min)) -> (P(min))
(P(min), R, R) -> (P(min))
(P(sum), R, P(sum)) -> (P(sum))
(R, R, P(avg)) -> (P(avg))
(R, R, P(max)) -> (P(max))
(R, R, P(min)) -> (P(min))
(R, R, R) -> (R)
(S(0), S(0), S(0)) -> (S(0))""")

    def test_scatter_value_table(self) -> None:
        self.assertExpectedInline(strategy_table(aten.scatter.value, (torch.randn(4, 6), 1, torch.randint(0, 6, (4, 3)), 1.5)), """\
(P(avg), R) -> (P(avg))
(P(max), R) -> (P(max))
(P(min), R) -> (P(min))
(R, R) -> (R)
(S(0), S(0)) -> (S(0))""")

    def test_scatter_reduce_amax_table(self) -> None:
        args = (torch.randn(4, 6), 0, torch.randint(0, 4, (5, 6)), torch.randn(5, 6), "amax")
        self.assertExpectedInline(strategy_table(aten.scatter_reduce.two, args, {"include_self": True}), """\
(P(max), R, P(max)) -> (P(max))
(P(max), R, R) -> (P(max))
(P(max), S(0), S(0)) -> (P(max))
(P(min), R, R) -> (P(min))
(R, R, P(max)) -> (P(max))
(R, R, R) -> (R)
(R, S(0), S(0)) -> (P(max))
(S(1), S(1), S(1)) -> (S(1))""")

"""cat and slice_scatter rules: every emitted strategy reproduces single-device torch."""

from __future__ import annotations

import pytest

import torch
from expecttest import TestCase
from hypothesis import given
from hypothesis import strategies as st
from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

import dtensor_rules  # noqa: F401  (installs the rules)
from dtensor_rules.op_rules.slicing import CAT, SLICE_SCATTER
from dtensor_rules.testing import check_rule, check_samples, simulated_mesh
from dtensor_rules.testing import strategies as dst
from dtensor_rules.testing.dispatch import to_dtensor
from dtensor_rules.testing.suites import samples_for
from dtensor_rules.testing.tables import strategy_table

aten = torch.ops.aten
MESHES = [(2,), (4,), (2, 2), (2, 4), (2, 2, 2)]
DTYPES = (torch.float32, torch.bfloat16, torch.int64)




def assert_no_incorrect(op, args, mesh):  # noqa: ANN001, ANN201
    report = check_rule(op, args, {}, mesh, max_nd_combos=150)
    assert report.ours.error is None, report.ours.error
    assert report.ours.incorrect == 0, report.summary()
    return report




@st.composite
def cat_calls(draw):  # noqa: ANN001, ANN201
    mesh = draw(st.sampled_from(MESHES))
    ndim = draw(st.integers(1, 3))
    base = list(draw(dst.shapes(ndim, ndim, 1, 6)))
    dim = draw(st.integers(-ndim, ndim - 1))
    dtype = draw(st.sampled_from(DTYPES))
    tensors = []
    for _ in range(draw(st.integers(1, 3))):
        if draw(st.integers(0, 5)) == 0:
            tensors.append(torch.zeros(0, dtype=dtype))  # legacy empty, skipped by cat
            continue
        shape = list(base)
        shape[dim] = draw(st.integers(0, 5))
        tensors.append(draw(dst.tensors(shape, dtype)))
    if all(t.shape == (0,) for t in tensors):  # keep at most 3 inputs: ground truth is exponential in them
        tensors[-1] = draw(dst.tensors(base, dtype))
    return mesh, (tensors, dim)


@pytest.mark.slow  # over ~9 s of the inner loop (pyproject.toml)
@given(cat_calls())
def test_cat_every_emitted_strategy_is_correct(call) -> None:  # noqa: ANN001
    mesh, args = call
    assert_no_incorrect(aten.cat.default, args, mesh)


@st.composite
def slice_scatter_calls(draw):  # noqa: ANN001, ANN201
    mesh = draw(st.sampled_from(MESHES))
    shape = list(draw(dst.shapes(1, 3, 1, 6)))
    ndim = len(shape)
    dim = draw(st.integers(-ndim, ndim - 1))
    bound = st.one_of(st.none(), st.integers(-9, 9))
    start, end, step = draw(bound), draw(bound), draw(st.integers(1, 3))
    dtype = draw(st.sampled_from(DTYPES))
    _, length = slice(start, end, step).indices(shape[dim]), len(range(*slice(start, end, step).indices(shape[dim])))
    src_shape = list(shape)
    src_shape[dim] = length
    self_t = draw(dst.tensors(shape, dtype))
    src = draw(dst.tensors(src_shape, draw(st.sampled_from((dtype, torch.float32)))))
    return mesh, (self_t, src, dim, start, end, step)


@pytest.mark.slow  # over ~9 s of the inner loop (pyproject.toml)
@given(slice_scatter_calls())
def test_slice_scatter_every_emitted_strategy_is_correct(call) -> None:  # noqa: ANN001
    mesh, args = call
    assert_no_incorrect(aten.slice_scatter.default, args, mesh)


def test_suites_ours_correct_and_at_least_upstream() -> None:
    for op in (CAT[0], SLICE_SCATTER[0]):
        report = check_samples(op, samples_for(op), (2,))
        assert report.ours.incorrect == 0, report.summary()
        assert report.ours.correct >= report.upstream.correct, report.summary()


def test_cat_out_variant_end_to_end() -> None:
    a, b = torch.randn(5, 3), torch.randn(5, 2)
    with simulated_mesh((2,)) as mesh:
        da, db = (distribute_tensor(t, mesh, [Shard(0)]) for t in (a, b))
        dout = distribute_tensor(torch.empty(5, 5), mesh, [Shard(0)])
        torch.cat([da, db], 1, out=dout)
        assert tuple(dout.placements) == (Shard(0),)
        torch.testing.assert_close(dout.full_tensor(), torch.cat([a, b], 1))


def test_cat_end_to_end_partial_and_shard() -> None:
    a, b = torch.randn(5, 3), torch.randn(5, 4)
    with simulated_mesh((2, 2)) as mesh:
        da = to_dtensor(a, mesh, [Shard(0), Partial("max")])
        db = to_dtensor(b, mesh, [Shard(0), Partial("max")])
        out = torch.cat([da, db], dim=-1)
        assert tuple(out.placements) == (Shard(0), Partial("max"))
        torch.testing.assert_close(out.full_tensor(), torch.cat([a, b], -1))


def test_cat_end_to_end_backward_matches_single_device() -> None:
    a, b = torch.randn(4, 3), torch.randn(4, 6)
    ref_a, ref_b = a.clone().requires_grad_(), b.clone().requires_grad_()
    (torch.cat([ref_a, ref_b], 1) ** 2).sum().backward()
    with simulated_mesh((2,)) as mesh:
        da = distribute_tensor(a, mesh, [Shard(0)]).requires_grad_()
        db = distribute_tensor(b, mesh, [Shard(0)]).requires_grad_()
        (torch.cat([da, db], 1) ** 2).sum().backward()
        torch.testing.assert_close(da.grad.full_tensor(), ref_a.grad)
        torch.testing.assert_close(db.grad.full_tensor(), ref_b.grad)


def test_slice_scatter_end_to_end_src_placement_differs_from_self() -> None:
    x, src = torch.randn(6, 7), torch.randn(6, 3)
    with simulated_mesh((2,)) as mesh:
        dx = to_dtensor(x, mesh, [Partial("avg")])
        dsrc = distribute_tensor(src, mesh, [Replicate()])
        out = torch.slice_scatter(dx, dsrc, 1, 1, 7, 2)
        assert tuple(out.placements) == (Partial("avg"),)
        torch.testing.assert_close(out.full_tensor(), torch.slice_scatter(x, src, 1, 1, 7, 2))


def test_slice_scatter_backward_ops_end_to_end() -> None:
    """The ops slice_scatter's backward runs (slice for src, slice_scatter of zeros for self).

    Autograd itself cannot run this backward on DTensor (upstream too): the formula builds
    its zeros with a plain factory, which DTensor refuses to mix; we check the ops it runs.
    """
    grad = torch.randn(5, 8)
    with simulated_mesh((2,)) as mesh:
        dgrad = distribute_tensor(grad, mesh, [Shard(0)])
        dzeros = distribute_tensor(torch.zeros(5, 3), mesh, [Shard(0)])
        grad_self = torch.slice_scatter(dgrad, dzeros, 1, -6, None, 2)
        grad_src = aten.slice.Tensor(dgrad, 1, -6, None, 2)
        assert tuple(grad_self.placements) == (Shard(0),)
        torch.testing.assert_close(grad_self.full_tensor(), torch.slice_scatter(grad, torch.zeros(5, 3), 1, -6, None, 2))
        torch.testing.assert_close(grad_src.full_tensor(), grad[:, -6::2])


def test_slice_scatter_rejects_what_torch_rejects() -> None:
    with simulated_mesh((2,)) as mesh:
        dx = distribute_tensor(torch.randn(4, 6), mesh, [Shard(0)])
        dsrc = distribute_tensor(torch.randn(4, 3), mesh, [Shard(0)])
        try:
            torch.slice_scatter(dx, dsrc, 1, 0, 4)  # slice has 4 columns, src 3
        except RuntimeError as e:
            assert "slice" in str(e)
        else:
            raise AssertionError("a src that does not fit the slice must be rejected")


class GoldenTables(TestCase):
    def test_cat_table(self) -> None:
        self.assertExpectedInline(strategy_table(aten.cat.default, ([torch.randn(4, 3), torch.randn(4, 2)], 1)), """\
(P(avg), P(avg)) -> (P(avg))
(P(avg), R) -> (P(avg))
(P(max), P(max)) -> (P(max))
(P(max), R) -> (P(max))
(P(min), P(min)) -> (P(min))
(P(min), R) -> (P(min))
(P(sum), P(sum)) -> (P(sum))
(R, P(avg)) -> (P(avg))
(R, P(max)) -> (P(max))
(R, P(min)) -> (P(min))
(R, R) -> (R)
(S(0), S(0)) -> (S(0))""")

    def test_slice_scatter_table(self) -> None:
        self.assertExpectedInline(strategy_table(aten.slice_scatter.default, (torch.randn(4, 6), torch.randn(4, 2), 1, 1, 5, 2)), """\
(P(avg), P(avg)) -> (P(avg))
(P(avg), R) -> (P(avg))
(P(max), P(max)) -> (P(max))
(P(max), R) -> (P(max))
(P(min), P(min)) -> (P(min))
(P(min), R) -> (P(min))
(P(sum), P(sum)) -> (P(sum))
(R, P(avg)) -> (P(avg))
(R, P(max)) -> (P(max))
(R, P(min)) -> (P(min))
(R, R) -> (R)
(S(0), S(0)) -> (S(0))""")

"""_softmax_backward_data: every emitted strategy valid; Partial gradients pass (upstream misses them)."""

from __future__ import annotations

import pytest

import expecttest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.distributed.tensor.placement_types import Partial, Replicate, Shard

from dtensor_rules.op_rules.softmax import SOFTMAX_BACKWARD
from dtensor_rules.testing import simulated_mesh
from dtensor_rules.testing import strategies as dst
from dtensor_rules.testing.dispatch import full_value, to_dtensor
from dtensor_rules.testing.tables import strategy_table
from tests._rule_checks import assert_dispatch_matches, assert_rule_sound_and_complete

OP, OUT_OP = SOFTMAX_BACKWARD
MESHES = [(2,), (4,), (2, 2)]


@st.composite
def softmax_backward_args(draw):
    shape = draw(dst.shapes(min_dims=1, max_dims=3, min_side=1, max_side=6))
    dtype = draw(dst.dtypes())
    dim = draw(st.integers(-len(shape), len(shape) - 1))
    y = draw(dst.tensors(shape, torch.float32)).softmax(dim).to(dtype)
    g = draw(dst.tensors(shape, dtype))
    return g, y, dim, dtype


@pytest.mark.slow  # over ~9 s of the inner loop (pyproject.toml)
@given(softmax_backward_args(), st.sampled_from(MESHES))
def test_softmax_backward_rule_is_sound_and_complete(args, mesh_shape):
    assert_rule_sound_and_complete(OP, args, None, mesh_shape)


@given(softmax_backward_args(), st.sampled_from(MESHES), st.integers(0, 1000))
def test_softmax_backward_through_dtensor_dispatch(args, mesh_shape, seed):
    assert_dispatch_matches(OP, args, None, mesh_shape, seed)


def test_out_variant_writes_into_a_sharded_grad_input():
    g, y = torch.randn(6, 5), torch.randn(6, 5).softmax(1)
    expected = OP(g, y, 1, torch.float32)
    with simulated_mesh((2, 2)) as mesh:
        placements = [Shard(0), Partial("sum")]
        gd = to_dtensor(g, mesh, placements)
        yd = to_dtensor(y, mesh, [Shard(0), Replicate()])
        out = to_dtensor(torch.zeros(6, 5), mesh, placements)
        res = OUT_OP(gd, yd, 1, torch.float32, grad_input=out)
        assert res is out and out.placements == tuple(placements)
        torch.testing.assert_close(full_value(out), expected)


class TestSoftmaxBackwardTable(expecttest.TestCase):
    def test_strategy_table(self):
        g, y = torch.randn(4, 3, 5), torch.randn(4, 3, 5).softmax(1)
        self.assertExpectedInline(strategy_table(OP, (g, y, 1, torch.float32), mesh_shape=(2,)), """\
(P(avg), R) -> (P(avg))
(P(sum), R) -> (P(sum))
(R, R) -> (R)
(S(0), S(0)) -> (S(0))
(S(2), S(2)) -> (S(2))""")

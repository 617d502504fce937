"""prims.fma: every emitted strategy is valid for all inputs; none of the valid ones is missing."""

from __future__ import annotations

import expecttest
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dtensor_rules.op_rules.fma import fma
from dtensor_rules.testing import strategies as dst
from dtensor_rules.testing.tables import strategy_table
from tests._rule_checks import assert_dispatch_matches, assert_rule_sound_and_complete

MESHES = [(2,), (4,), (2, 2)]


@st.composite
def fma_args(draw):
    """Three operands that broadcast together: some dims dropped or set to 1."""
    out = draw(dst.shapes(min_dims=1, max_dims=3, min_side=1, max_side=6))
    dtype = draw(dst.dtypes())

    def operand():
        k = draw(st.integers(0, len(out)))
        shape = [1 if draw(st.booleans()) and draw(st.booleans()) else s for s in out[k:]]
        return draw(dst.tensors(shape, dtype))

    return operand(), operand(), draw(dst.tensors(out, dtype))


@pytest.mark.slow  # the ground-truth sweep over three operands on (2, 2)
@given(fma_args(), st.sampled_from(MESHES))
def test_fma_rule_is_sound_and_complete(args, mesh_shape):
    assert_rule_sound_and_complete(fma, args, None, mesh_shape)


@given(fma_args(), st.sampled_from(MESHES), st.integers(0, 1000))
def test_fma_through_dtensor_dispatch(args, mesh_shape, seed):
    assert_dispatch_matches(fma, args, None, mesh_shape, seed)


class TestFmaTable(expecttest.TestCase):
    def test_strategy_table_with_broadcast_addend(self):
        a, b, c = torch.randn(4, 3), torch.randn(4, 3), torch.randn(3)
        self.assertExpectedInline(
            strategy_table(fma, (a, b, c), mesh_shape=(2,)),
            """\
(P(avg), R, P(avg)) -> (P(avg))
(P(avg), R, R) -> (P(avg))
(P(sum), R, P(sum)) -> (P(sum))
(R, P(avg), P(avg)) -> (P(avg))
(R, P(avg), R) -> (P(avg))
(R, P(sum), P(sum)) -> (P(sum))
(R, R, P(avg)) -> (P(avg))
(R, R, P(max)) -> (P(max))
(R, R, P(min)) -> (P(min))
(R, R, R) -> (R)
(S(0), S(0), R) -> (S(0))
(S(1), S(1), S(0)) -> (S(1))""",
        )

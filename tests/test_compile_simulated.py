"""``torch.compile`` of DTensor code on the simulated mesh: the two upstream limits docs/compile.md names.

These pin upstream behaviour (``LocalTensorMode``, torch 2.13 and 2.14.1), so that the docs'
"Why not on the simulated mesh" is revisited when upstream lifts a limit: then a test fails.
The ``hinted_strategy_costs`` patch lifts one of them for ops that upstream prices (``mm`` on a
2-D mesh); the tests pin that and what still fails with it.
Compiled runs of the package's code are on real gloo ranks (tests/test_moe_compile.py and the
recipe in docs/compile.md, run by tests/test_docs_scripts.py).
"""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

import dtensor_rules
from dtensor_rules import patches
from dtensor_rules.testing import simulated_mesh


def test_mark_unbacked_refuses_a_simulated_dtensor() -> None:
    with simulated_mesh((2, 2)) as mesh:
        x = distribute_tensor(torch.randn(8, 4), mesh, (Shard(0), Replicate()))
        with pytest.raises(AssertionError, match="not implemented yet"):
            torch._dynamo.decorators.mark_unbacked(x, 0)


def _compiled_mm(shape: tuple[int, ...]) -> torch.Tensor:
    torch._dynamo.reset()
    with simulated_mesh(shape) as mesh:
        x = distribute_tensor(torch.randn(20, 16), mesh, (Shard(0),) + (Replicate(),) * (len(shape) - 1))
        w = distribute_tensor(torch.randn(16, 4), mesh, (Replicate(),) * len(shape))
        out = torch.compile(torch.mm, backend="aot_eager", dynamic=True)(x, w)
        torch.testing.assert_close(out.full_tensor(), x.full_tensor() @ w.full_tensor())
        return out


def _upstream_pricing() -> list[str]:
    return [n for n in patches.defaults() if n != "hinted_strategy_costs"]


def test_backed_dynamic_compile_fails_on_a_2d_simulated_mesh_with_upstreams_pricing() -> None:
    """Per-rank symbolic shard offsets cannot be merged; the 1-D control compiles and is right."""
    with dtensor_rules.installed(patches=_upstream_pricing()):
        with pytest.raises(Exception, match="Non Tensor or int rank results must be equal for all ranks"):
            _compiled_mm((2, 2))
        assert _compiled_mm((2,)).shape == (20, 4)


def test_hinted_pricing_lets_mm_compile_on_a_2d_simulated_mesh() -> None:
    """``hinted_strategy_costs`` prices concrete specs, so no per-rank symbolic offset is merged
    (``_compiled_mm`` compares with plain torch on the full tensors)."""
    assert "hinted_strategy_costs" in patches.applied()
    assert _compiled_mm((2, 2)).shape == (20, 4)


def test_a_column_slice_of_token_sharded_rows_still_fails_on_a_2d_simulated_mesh() -> None:
    """What still stops the MoE block (``flat_assignments`` slices the (T, k) ids per column):
    slicing the meta tensor merges per-rank symbolic results, with our pricing or upstream's."""
    torch._dynamo.reset()
    with simulated_mesh((2, 2)) as mesh:
        x = distribute_tensor(torch.randn(20, 4), mesh, (Shard(0), Replicate()))
        with pytest.raises(Exception, match="Non Tensor or int rank results must be equal for all ranks"):
            torch.compile(lambda t: t[:, 0:1] * 2, backend="aot_eager", dynamic=True)(x)

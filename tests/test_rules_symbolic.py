"""Symbolic shapes: _grouped_mm, prims.fma and softmax backward on DTensor inputs under
``torch.compile(backend="aot_eager", dynamic=True, fullgraph=True)``, with backed dynamic sizes and
with unbacked sizes (``mark_unbacked``; the token count M of a grouped mm is THE dynamic MoE case).

A fake process group (as upstream's ``TestUnbackedDTensorOps``): rank 0's shard is real data, so
the cases use placements that need no communication and compare rank 0's local result with plain
torch on the same slice; cases that must redistribute check that tracing neither guards on a
data-dependent size nor breaks the graph (collectives of the fake group return no data).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

import dtensor_rules  # noqa: F401
from dtensor_rules.op_rules.fma import fma
from dtensor_rules.op_rules.grouped_mm import GROUPED_MM
from dtensor_rules.op_rules.softmax import SOFTMAX_BACKWARD
from dtensor_rules.testing import fake_world

pytestmark = pytest.mark.slow  # see pyproject.toml

SBD = SOFTMAX_BACKWARD[0]


@pytest.fixture
def mesh():  # noqa: ANN201
    torch._dynamo.reset()
    with fake_world(2):
        yield init_device_mesh("cpu", (2,))
    torch._dynamo.reset()


def _dt(mesh, full: torch.Tensor, placement, local: torch.Tensor | None = None) -> DTensor:  # noqa: ANN001
    """``full`` as a DTensor whose rank-0 shard is ``local`` (default: the full tensor, for R / P)."""
    local = full if local is None else local.contiguous()
    return DTensor.from_local(local, mesh, [placement], run_check=False, shape=full.shape, stride=full.stride())


def _compiled(fn: Callable, *args: DTensor, unbacked: dict[int, list[int]] | None = None) -> DTensor:
    for i, dims in (unbacked or {}).items():
        for d in dims:
            torch._dynamo.decorators.mark_unbacked(args[i], d)
    return torch.compile(fn, backend="aot_eager", dynamic=True, fullgraph=True)(*args)


UNBACKED = [None, "unbacked"]


@pytest.mark.parametrize("kind", UNBACKED, ids=["backed", "unbacked"])
def test_grouped_mm_tokens_dynamic_weights_sharded_on_n(mesh, kind) -> None:  # noqa: ANN001
    """2-D x 3-D with M (tokens) dynamic / unbacked: N-sharded experts need no communication."""
    g = torch.Generator().manual_seed(0)
    a, w = torch.randn(12, 16, generator=g).bfloat16(), torch.randn(4, 16, 32, generator=g).bfloat16()
    offs = torch.tensor([3, 3, 9, 12], dtype=torch.int32)
    da, dw, do = _dt(mesh, a, Replicate()), _dt(mesh, w, Shard(2), w[..., :16]), _dt(mesh, offs, Replicate())
    out = _compiled(lambda x, y, o: GROUPED_MM(x, y, o), da, dw, do, unbacked={0: [0]} if kind else None)
    assert out.placements == (Shard(1),) and out.shape == (12, 32)
    torch.testing.assert_close(out.to_local(), GROUPED_MM(a, w, offs)[:, :16])


@pytest.mark.parametrize("kind", UNBACKED, ids=["backed", "unbacked"])
def test_grouped_mm_k_partial_with_dynamic_tokens(mesh, kind) -> None:  # noqa: ANN001
    """K sharded on both operands -> P(sum) output, M unbacked: the K split is static, M is never split."""
    g = torch.Generator().manual_seed(1)
    a, w = torch.randn(10, 32, generator=g).bfloat16(), torch.randn(2, 32, 16, generator=g).bfloat16()
    offs = torch.tensor([4, 10], dtype=torch.int32)
    da, dw = _dt(mesh, a, Shard(1), a[:, :16]), _dt(mesh, w, Shard(1), w[:, :16])
    out = _compiled(lambda x, y, o: GROUPED_MM(x, y, o), da, dw, _dt(mesh, offs, Replicate()),
                    unbacked={0: [0]} if kind else None)
    assert out.placements == (Partial("sum"),)
    torch.testing.assert_close(out.to_local(), GROUPED_MM(a[:, :16], w[:, :16], offs))


@pytest.mark.parametrize("kind", UNBACKED, ids=["backed", "unbacked"])
def test_grouped_mm_batched_experts_unbacked(mesh, kind) -> None:  # noqa: ANN001
    """3-D x 3-D with experts sharded and every size unbacked: the expert split needs no size check."""
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(4, 6, 16, generator=g).bfloat16(), torch.randn(4, 16, 8, generator=g).bfloat16()
    da, db = _dt(mesh, a, Shard(0), a[:2]), _dt(mesh, b, Shard(0), b[:2])
    out = _compiled(lambda x, y: GROUPED_MM(x, y), da, db, unbacked={0: [0, 1], 1: [0]} if kind else None)
    assert out.placements == (Shard(0),)
    torch.testing.assert_close(out.to_local(), GROUPED_MM(a[:2], b[:2]))


def test_alignment_filter_never_guards_on_an_unbacked_size() -> None:
    """An unbacked N or K sharded: whether the shards stay 16-byte aligned is unknowable, so the
    strategy is dropped (``guard_or_false``), not guarded on. (torch's own meta kernel cannot take
    an unbacked K or N either, so this is checked on the filter directly.)"""
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from dtensor_rules.kernels.grouped_mm_checks import kernel_accepts_layout, shards_accepted_cached

    env = ShapeEnv()
    n = env.create_unbacked_symint()
    shape, stride = (2, 16, n), (16 * n, n, 1)
    assert shards_accepted_cached(shape, stride, 2, (None,), (2,))  # N not split: nothing to decide
    assert not shards_accepted_cached(shape, stride, 2, (2,), (2,))  # N split: unknown -> dropped
    assert not kernel_accepts_layout(shape, stride, 2)  # unknown -> "not accepted": the handler copies
    assert shards_accepted_cached((n, 16), (16, 1), 2, (1,), (2,))  # M unbacked, K = 16 split: decidable


@pytest.mark.parametrize("kind", UNBACKED, ids=["backed", "unbacked"])
def test_fma_dynamic_rows_with_broadcast_bias(mesh, kind) -> None:  # noqa: ANN001
    g = torch.Generator().manual_seed(3)
    a, b, c = torch.randn(8, 6, generator=g), torch.randn(6, generator=g), torch.randn(8, 6, generator=g)
    da, db, dc = _dt(mesh, a, Shard(0), a[:4]), _dt(mesh, b, Replicate()), _dt(mesh, c, Shard(0), c[:4])
    out = _compiled(lambda x, y, z: fma(x, y, z), da, db, dc, unbacked={0: [0], 2: [0]} if kind else None)
    assert out.placements == (Shard(0),)
    torch.testing.assert_close(out.to_local(), fma(a[:4], b, c[:4]))


def test_fma_partial_inputs_with_unbacked_sizes(mesh) -> None:  # noqa: ANN001
    a, c = torch.randn(8, 6), torch.randn(8, 6)
    out = _compiled(lambda x, y, z: fma(x, y, z), _dt(mesh, a, Partial("sum")), _dt(mesh, a, Replicate()),
                    _dt(mesh, c, Partial("sum")), unbacked={0: [0, 1], 1: [0, 1], 2: [0, 1]})
    assert out.placements == (Partial("sum"),)
    torch.testing.assert_close(out.to_local(), fma(a, a, c))


@pytest.mark.parametrize("kind", UNBACKED, ids=["backed", "unbacked"])
def test_fma_needing_redistribution_traces(mesh, kind) -> None:  # noqa: ANN001
    """No zero-cost strategy (a split on rows, b on columns): upstream's expansion of the narrowed rows."""
    a, c = torch.randn(8, 6), torch.randn(8, 6)
    mixed = _compiled(lambda x, y, z: fma(x, y, z), _dt(mesh, a, Shard(0), a[:4]), _dt(mesh, a, Shard(1), a[:, :3]),
                      _dt(mesh, c, Replicate()), unbacked={0: [0], 1: [0], 2: [0]} if kind else None)
    assert mixed.shape == (8, 6)


@pytest.mark.parametrize("kind", UNBACKED, ids=["backed", "unbacked"])
def test_softmax_backward_dynamic(mesh, kind) -> None:  # noqa: ANN001
    g = torch.Generator().manual_seed(4)
    grad, y = torch.randn(8, 5, generator=g), torch.randn(8, 5, generator=g).softmax(1)
    dg, dy = _dt(mesh, grad, Shard(0), grad[:4]), _dt(mesh, y, Shard(0), y[:4])
    out = _compiled(lambda x, z: SBD(x, z, 1, torch.float32), dg, dy, unbacked={0: [0, 1], 1: [0, 1]} if kind else None)
    assert out.placements == (Shard(0),)
    torch.testing.assert_close(out.to_local(), SBD(grad[:4], y[:4], 1, torch.float32))
    part = _compiled(lambda x, z: SBD(x, z, 1, torch.float32), _dt(mesh, grad, Partial("sum")), _dt(mesh, y, Replicate()),
                     unbacked={0: [0], 1: [0]} if kind else None)
    assert part.placements == (Partial("sum"),)
    torch.testing.assert_close(part.to_local(), SBD(grad, y, 1, torch.float32))

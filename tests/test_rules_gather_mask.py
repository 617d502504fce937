"""gather with self sharded on the gather dim and the index replicated: a masked partial, no all-gather.

The oracle is ``torch.gather`` on the full tensors. Upstream's own scenario (its
``DistTensorOpsTest.test_gather`` case 2: 12x8x16 sharded on dim 1, a (4, 1, 8) index) and wider
indices, uneven and empty chunks, nested mesh dims, and the uses upstream's buffer-held mask
fails on (reduce twice, backward, ``sum()``, two results alive) all match single-device torch.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode

import dtensor_rules
from dtensor_rules import registry
from dtensor_rules._upstream import IndexMaskPartial, MaskPartial
from dtensor_rules.testing import check_rule, fake_world, local_shards, simulated_mesh
from dtensor_rules.testing import strategies as dst

GATHER = torch.ops.aten.gather.default

# (mesh, self placements): the gather dim (1) sharded on one mesh dim, on two (nested), beside
# a Shard(0) that the index shares (equal sizes on dim 0)
LAYOUTS = [
    ((4,), (Shard(1),)),
    ((2,), (Shard(1),)),
    ((2, 2), (Shard(1), Replicate())),
    ((2, 2), (Replicate(), Shard(1))),
    ((2, 2), (Shard(1), Shard(1))),
    ((2, 2), (Shard(0), Shard(1))),
    ((2, 2, 2), (Shard(1), Shard(0), Shard(1))),
]


def _masked_dims(placements: tuple) -> list[int]:
    return [k for k, p in enumerate(placements) if isinstance(p, MaskPartial)]


def _pays(x: torch.Tensor, dim: int, index: torch.Tensor) -> bool:
    """Offered: one lookup per row, or at most half as many lookups as self has elements."""
    return index.shape[dim] == 1 or 2 * index.numel() <= x.numel()


@pytest.mark.parametrize("index_rows", [1, 5], ids=["upstream-index", "wide-index"])
@pytest.mark.parametrize("self_size", [16, 15], ids=["even", "uneven"])
@pytest.mark.parametrize("mesh_shape, placements", LAYOUTS, ids=lambda v: str(v))
def test_self_sharded_on_gather_dim_needs_no_communication(mesh_shape, placements, self_size, index_rows) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(12, self_size, 16, generator=g)
    index = torch.randint(0, self_size, (12, index_rows, 16), generator=g)
    with simulated_mesh(mesh_shape) as mesh:
        dx = distribute_tensor(x, mesh, placements)
        di = distribute_tensor(index, mesh, [Replicate()] * len(mesh_shape))
        with CommDebugMode() as comm:
            out = torch.gather(dx, 1, di)
        assert comm.get_total_counts() == 0, comm.get_comm_counts()
        assert _masked_dims(out.placements) == [k for k, p in enumerate(placements) if p == Shard(1)]
        assert torch.equal(out.full_tensor(), torch.gather(x, 1, index))


@pytest.mark.parametrize("mesh_shape, placements", [LAYOUTS[0], LAYOUTS[4]], ids=lambda v: str(v))
def test_backward_matches_torch(mesh_shape, placements) -> None:
    g = torch.Generator().manual_seed(1)
    x, index = torch.randn(6, 7, 3, generator=g), torch.randint(0, 7, (6, 3, 3), generator=g)
    ref = x.clone().requires_grad_()
    (torch.gather(ref, 1, index) ** 2).sum().backward()
    with simulated_mesh(mesh_shape) as mesh:
        dx = distribute_tensor(x, mesh, placements).requires_grad_()
        out = torch.gather(dx, 1, distribute_tensor(index, mesh, [Replicate()] * len(mesh_shape)))
        assert _masked_dims(out.placements)
        (out**2).sum().backward()  # pow reduces out; its backward reads the saved masked partial again
        torch.testing.assert_close(dx.grad.full_tensor(), ref.grad)


def test_masked_results_reduce_any_number_of_times_and_in_any_order() -> None:
    """What upstream's shared mask buffer fails: reduce twice, two results of different indices
    alive at once, ``sum()`` keeping the placement on a scalar, a reduce-scatter."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(12, 8, 16, generator=g)
    i1, i2 = torch.randint(0, 8, (4, 1, 8), generator=g), torch.randint(0, 8, (4, 1, 8), generator=g)
    with simulated_mesh((4,)) as mesh:
        dx = distribute_tensor(x, mesh, [Shard(1)])
        o1 = torch.gather(dx, 1, distribute_tensor(i1, mesh, [Replicate()]))
        o2 = torch.gather(dx, 1, distribute_tensor(i2, mesh, [Replicate()]))
        assert torch.equal(o2.full_tensor(), torch.gather(x, 1, i2))
        assert torch.equal(o1.full_tensor(), torch.gather(x, 1, i1))
        assert torch.equal(o1.full_tensor(), torch.gather(x, 1, i1))
        total = o1.sum()  # torch 2.13's sum keeps the masked placement on the scalar (2.14's reduces first)
        torch.testing.assert_close(total.full_tensor(), torch.gather(x, 1, i1).sum())
        scattered = o2.redistribute(mesh, [Shard(0)])
        assert torch.equal(scattered.full_tensor(), torch.gather(x, 1, i2))


def test_an_index_out_of_range_raises_like_torch() -> None:
    x = torch.randn(4, 6)
    for bad in (6, -1):
        index = torch.tensor([[0, bad]])
        with pytest.raises(RuntimeError, match="out of bounds"):
            torch.gather(x, 1, index)
        with simulated_mesh((2,)) as mesh:
            dx, di = distribute_tensor(x, mesh, [Shard(1)]), distribute_tensor(index, mesh, [Replicate()])
            with pytest.raises(RuntimeError, match="out of bounds for dimension 1 with size 6"):
                torch.gather(dx, 1, di)


def test_nothing_is_redistributed_into_a_masked_partial() -> None:
    """Cutting a replicated tensor as a value would cut an index wrong: refused, clearly."""
    with simulated_mesh((2,)) as mesh:
        with pytest.raises(RuntimeError, match="cannot be redistributed to IndexMaskPartial"):
            distribute_tensor(torch.arange(6).reshape(2, 3), mesh, [IndexMaskPartial((2, 3), 1)])


def test_many_lookups_keep_the_all_gather() -> None:
    """More lookups than half of self: reducing a masked result would move more than the all-gather."""
    x, index = torch.randn(4, 6), torch.randint(0, 6, (4, 4))
    with simulated_mesh((2,)) as mesh:
        out = torch.gather(distribute_tensor(x, mesh, [Shard(1)]), 1, distribute_tensor(index, mesh, [Replicate()]))
        assert tuple(out.placements) == (Replicate(),)
        assert torch.equal(out.full_tensor(), torch.gather(x, 1, index))


def test_partial_install_keeps_the_all_gather() -> None:
    """``install(ops=[gather])`` applies no cache-miss hook, which makes the mask: the row is not offered."""
    x, index = torch.randn(4, 6), torch.randint(0, 6, (4, 2))
    dtensor_rules.uninstall()
    try:
        with registry.installed("override", [GATHER]), simulated_mesh((2,)) as mesh:
            out = torch.gather(distribute_tensor(x, mesh, [Shard(1)]), 1, distribute_tensor(index, mesh, [Replicate()]))
            assert not _masked_dims(out.placements)
            assert torch.equal(out.full_tensor(), torch.gather(x, 1, index))
    finally:
        dtensor_rules.install()


DTYPES = (torch.float32, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.int8, torch.bool)


@st.composite
def masked_calls(draw):  # noqa: ANN001, ANN201
    """(mesh, self placements, self, dim, index): size-1 and empty dims, chunks uneven or empty."""
    mesh_shape = draw(st.sampled_from([(2,), (3,), (4,), (2, 2), (2, 3)]))
    ndim = draw(st.integers(1, 3))
    dim = draw(st.integers(0, ndim - 1))
    self_shape = list(draw(dst.shapes(ndim, ndim, 1, 6)))
    index_shape = [draw(st.sampled_from([s, 1, 0])) if d != dim else draw(st.integers(0, 4)) for d, s in enumerate(self_shape)]
    dtype = draw(st.sampled_from(DTYPES))
    x = draw(dst.tensors(self_shape, dtype))
    index = torch.randint(0, self_shape[dim], tuple(index_shape), generator=torch.Generator().manual_seed(draw(st.integers(0, 999))))
    placements = tuple(draw(st.sampled_from([Shard(dim), Shard(dim), Replicate()])) for _ in mesh_shape)
    return mesh_shape, placements, x, dim, index


@given(masked_calls())
def test_any_dtype_and_size_matches_torch(call) -> None:  # noqa: ANN001
    mesh_shape, placements, x, dim, index = call
    with simulated_mesh(mesh_shape) as mesh:
        out = torch.gather(distribute_tensor(x, mesh, placements), dim, distribute_tensor(index, mesh, [Replicate()] * len(mesh_shape)))
        assert torch.equal(out.full_tensor(), torch.gather(x, dim, index))
        sharded = [k for k, p in enumerate(placements) if p == Shard(dim)]
        shards = math.prod(mesh_shape[k] for k in sharded)
        if x.dtype == torch.bool:  # no sum of bools: the masked strategy is not offered
            assert not _masked_dims(out.placements)
        elif x.numel() and index.numel() and x.shape[dim] >= shards and _pays(x, dim, index):
            assert _masked_dims(out.placements) == sharded  # (else nothing to move, not shardable, or too many lookups)


def test_a_rank_holding_an_empty_chunk_looks_up_nothing() -> None:
    """5 columns over 4 ranks are cut 2, 2, 1, 0: the last rank's lookups are all masked."""
    x, index = torch.randn(3, 5), torch.tensor([[4, 0], [1, 4], [0, 3]])
    with simulated_mesh((4,)) as mesh:
        out = torch.gather(distribute_tensor(x, mesh, [Shard(1)]), 1, distribute_tensor(index, mesh, [Replicate()]))
        assert _masked_dims(out.placements) == [0]
        assert [tuple(s.shape) for s in local_shards(distribute_tensor(x, mesh, [Shard(1)]))][-1] == (3, 0)
        assert torch.equal(local_shards(out)[-1], torch.zeros(3, 2))
        assert torch.equal(out.full_tensor(), torch.gather(x, 1, index))


@pytest.fixture
def fake_mesh():  # noqa: ANN201
    from torch.distributed.device_mesh import init_device_mesh

    torch._dynamo.reset()
    with fake_world(2):
        yield init_device_mesh("cpu", (2,))
    torch._dynamo.reset()


@pytest.mark.slow
@pytest.mark.parametrize("kind", [None, "unbacked"], ids=["backed", "unbacked"])
def test_compiled_with_dynamic_sizes(fake_mesh, kind) -> None:  # noqa: ANN001
    """``torch.compile(aot_eager, dynamic=True)``: the masked strategy traces (a fake group: rank 0's
    shard is real data; its local result is its own lookups, zeros where the index left its chunk)."""
    g = torch.Generator().manual_seed(3)
    x, index = torch.randn(6, 8, generator=g), torch.randint(0, 8, (6, 1), generator=g)  # sizes symbolic: one per row
    dx = DTensor.from_local(x[:, :4].contiguous(), fake_mesh, [Shard(1)], run_check=False, shape=x.shape, stride=x.stride())
    di = DTensor.from_local(index, fake_mesh, [Replicate()], run_check=False)
    if kind:
        torch._dynamo.decorators.mark_unbacked(dx, 0)
        torch._dynamo.decorators.mark_unbacked(di, 0)
    out = torch.compile(lambda a, b: torch.gather(a, 1, b), backend="aot_eager", dynamic=True, fullgraph=True)(dx, di)
    assert _masked_dims(out.placements) == [0]
    torch.testing.assert_close(out.to_local(), torch.gather(x, 1, index).masked_fill(index >= 4, 0))


def test_validator_models_both_mask_classes() -> None:
    """Upstream's ``_MaskPartial`` row (an index of size 1 on dim) counts as correct on one mesh dim;
    nested on two it is incorrect (its mask buffer conflicts, as it raises); ours nested is correct."""
    g = torch.Generator().manual_seed(4)
    args = (torch.randn(2, 5, 3, generator=g), 1, torch.randint(0, 5, (2, 1, 3), generator=g))
    flat = check_rule(GATHER, args, {}, (2,))
    assert flat.upstream.incorrect == 0 and flat.ours.incorrect == 0 and flat.ours.missing == 0
    nested = check_rule(GATHER, args, {}, (2, 2))
    assert "(S(1)S(1), M(1)M(1)) -> (M(1)M(1))" in nested.upstream.incorrect_combos
    assert nested.ours.incorrect == 0 and nested.ours.missing == 0
    assert nested.ours.correct > nested.upstream.correct

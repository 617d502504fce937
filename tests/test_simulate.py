"""The simulator cuts exactly the shards DTensor holds, and Partial splits reduce back exactly."""

from __future__ import annotations

import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from dtensor_rules._upstream import LocalTensor
from torch.distributed.tensor import distribute_tensor
from torch.distributed.tensor.placement_types import Partial, Replicate, Shard

from dtensor_rules.testing import simulated_mesh
from dtensor_rules.testing import strategies as dst
from dtensor_rules.testing.simulate import check_output, coords, local_input, split_partial


@st.composite
def layouts(draw):
    mesh_shape = draw(st.sampled_from([(2,), (3,), (2, 2), (2, 3)]))
    shape = draw(dst.shapes(min_dims=1, max_dims=3, min_side=1, max_side=7))
    placements = draw(dst.placement_lists(len(mesh_shape), len(shape), partial=False))
    return mesh_shape, shape, placements


@given(layouts())
def test_local_input_matches_dtensor_shards(layout):
    mesh_shape, shape, placements = layout
    full = torch.arange(torch.Size(shape).numel(), dtype=torch.float32).reshape(shape)
    with simulated_mesh(mesh_shape) as mesh:
        local = distribute_tensor(full, mesh, placements).to_local()
        for rank, c in enumerate(coords(mesh_shape)):
            held = local._local_tensors[rank] if isinstance(local, LocalTensor) else local
            torch.testing.assert_close(held, local_input(full, placements, mesh_shape, c, 0))


@given(
    st.sampled_from(["sum", "avg", "max", "min"]),
    st.integers(2, 4),
    dst.shapes(min_dims=0, max_dims=3),
    st.sampled_from([torch.float32, torch.float64, torch.int64, torch.int32]),
    st.integers(0, 100),
)
def test_partial_split_reduces_back(reduce_op, n, shape, dtype, salt):
    assume(reduce_op != "avg" or dtype.is_floating_point)  # an integer Partial has no avg
    x = (torch.randn(shape) * 5).to(dtype)
    parts = torch.stack([split_partial(x, reduce_op, n, i, salt) for i in range(n)])
    reduced = {"sum": parts.sum(0), "avg": parts.double().mean(0), "max": parts.amax(0), "min": parts.amin(0)}[reduce_op]
    torch.testing.assert_close(reduced.to(dtype), x, rtol=1e-6, atol=1e-5)
    if x.numel() > 1:
        assert not all(torch.equal(p, x) for p in parts), "contributions must differ from the full value"


def test_check_output_accepts_the_right_layout_and_rejects_others():
    truth = torch.arange(12.0).reshape(4, 3)
    shards = [truth[:2], truth[2:]]
    assert check_output(shards, truth, (Shard(0),), (2,)) is None
    assert "shape" in check_output(shards, truth, (Shard(1),), (2,))
    assert check_output([truth, truth], truth, (Replicate(),), (2,)) is None
    assert check_output([truth * 0.25, truth * 0.75], truth, (Partial("sum"),), (2,)) is None
    ints = torch.arange(12).reshape(4, 3)
    assert "values differ" in check_output([ints, ints + 1], ints, (Replicate(),), (2,))
    assert check_output([truth, truth + 1], truth, (Replicate(),), (2,)) is not None


def test_check_output_on_2d_mesh_mixes_partial_and_shard():
    truth = torch.randn(4, 6)
    locals_ = []
    for c in coords((2, 2)):
        piece = truth[:, 3 * c[1] : 3 * c[1] + 3]
        locals_.append(piece * (0.3 if c[0] == 0 else 0.7))
    assert check_output(locals_, truth, (Partial("sum"), Shard(1)), (2, 2)) is None
    assert check_output(locals_, truth, (Partial("max"), Shard(1)), (2, 2)) is not None


def test_masked_index_simulation_is_what_gather_dispatch_holds():
    """Per rank, the simulated lookups (index moved into the rank's nested chunk, masked results
    zeroed) equal the local result DTensor's gather dispatch produces, uneven chunks included."""
    from dtensor_rules._upstream import IndexMaskPartial
    from dtensor_rules.testing import local_shards
    from dtensor_rules.testing.simulate import Sample, run_ranks

    x, index = torch.randn(3, 7, 2), torch.randint(0, 7, (3, 3, 2))
    mask = IndexMaskPartial(tuple(x.shape), 1)
    for mesh_shape, pl in (((4,), (Shard(1),)), ((2, 2), (Shard(1), Shard(1))), ((2, 2), (Replicate(), Shard(1)))):
        index_pl = tuple(mask if p == Shard(1) else Replicate() for p in pl)
        runs = run_ranks(torch.ops.aten.gather.default, Sample((x, 1, index), {}), [pl, index_pl], mesh_shape, salt=0)
        simulated = [run.outputs[0].masked_fill(run.masks[mask], 0) for run in runs]
        with simulated_mesh(mesh_shape) as mesh:
            out = torch.gather(distribute_tensor(x, mesh, pl), 1, distribute_tensor(index, mesh, [Replicate()] * len(pl)))
            assert tuple(out.placements) == index_pl
            for got, want in zip(local_shards(out), simulated):
                assert torch.equal(got, want)
        assert check_output([r.outputs[0] for r in runs], torch.gather(x, 1, index), index_pl, mesh_shape,
                            masks=[r.masks for r in runs]) is None


def test_upstream_mask_partial_on_two_mesh_dims_conflicts_as_its_buffer_does():
    from dtensor_rules._upstream import MaskPartial
    from dtensor_rules.testing.simulate import Sample, run_ranks

    x, index = torch.randn(2, 8), torch.tensor([[1], [6]])
    mask = MaskPartial(offset_shape=x.shape, offset_dim=1)
    sample = Sample((x, 1, index), {})
    one = run_ranks(torch.ops.aten.gather.default, sample, [(Shard(1),), (mask,)], (2,), salt=0)
    assert check_output([r.outputs[0] for r in one], torch.gather(x, 1, index), (mask,), (2,),
                        masks=[r.masks for r in one]) is None
    nested = run_ranks(torch.ops.aten.gather.default, sample, [(Shard(1), Shard(1)), (mask, mask)], (2, 2), salt=0)
    assert isinstance(nested, str) and "conflicting" in nested

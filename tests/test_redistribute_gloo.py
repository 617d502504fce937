"""A few plans on real multi-process gloo (world size 4)."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Partial, Shard

from dtensor_rules.testing import run_gloo

pytestmark = pytest.mark.slow  # see pyproject.toml


def _worker(rank, world, mesh_shape, shape, src, dst):
    from dtensor_rules.redistribute import Layout, distribute_tensor, layout_of, local_shard_offsets, redistribute

    mesh = init_device_mesh("cpu", mesh_shape)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(-8, 9, shape, generator=g).float()
    a = distribute_tensor(x, mesh, src[0], src[1])
    b = redistribute(a, dst[0], dst[1])
    lay = Layout.from_placements(dst[0], len(shape), dst[1])
    assert layout_of(b._spec) == lay
    size, off = local_shard_offsets(lay, mesh_shape, shape, mesh.get_coordinate())
    exp = x[tuple(slice(o, o + s) for o, s in zip(off, size))]
    torch.testing.assert_close(b.to_local(), exp, rtol=0, atol=0)
    torch.testing.assert_close(b.full_tensor(), x, rtol=0, atol=0)
    return tuple(b.to_local().shape)


def test_gloo_ordered_shard_swap_uneven():
    src = ((Shard(0), Shard(0)), (1, 0))
    dst = ((Shard(1), Shard(0)), (0, 1))
    shapes = run_gloo(_worker, 4, (2, 2), (5, 7), src, dst)
    assert sorted(shapes) == sorted([(3, 4), (3, 3), (2, 4), (2, 3)])


def test_gloo_partial_reduce_scatter_into_ordered_shards():
    run_gloo(_worker, 4, (2, 2), (6, 3), ((Partial(), Shard(1)), None), ((Shard(1), Shard(0)), (1, 0)))

"""``dtensor_rules.testing.local_shards``: the public way to see per-rank shards."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Partial, Shard, distribute_tensor

from dtensor_rules.redistribute import Layout, local_shard_offsets
from dtensor_rules.redistribute import distribute_tensor as ordered_distribute
from dtensor_rules.testing import local_shards, run_gloo, simulated_mesh
from tests._redistribute_helpers import coords


def test_simulated_mesh_gives_every_rank_in_rank_order_uneven():
    full = torch.arange(5 * 3).reshape(5, 3)
    with simulated_mesh((2, 2)) as mesh:
        d = distribute_tensor(full, mesh, (Shard(0), Shard(1)))
        shards = local_shards(d)
        copies = local_shards(d.full_tensor())  # a simulated plain tensor: one copy per rank
    lay = Layout.from_placements((Shard(0), Shard(1)), 2)
    assert len(shards) == 4 and len(copies) == 4
    for r, c in enumerate(coords((2, 2))):  # rank r = mesh coordinate in row-major order
        size, off = local_shard_offsets(lay, (2, 2), full.shape, c)
        assert torch.equal(shards[r], full[off[0]:off[0] + size[0], off[1]:off[1] + size[1]])
        assert torch.equal(copies[r], full)


def test_partial_shards_are_the_raw_per_rank_pieces():
    full = torch.ones(4, dtype=torch.int64)
    with simulated_mesh((2,)) as mesh:
        d = ordered_distribute(full, mesh, (Partial("max"),))  # max: every rank holds v
        assert [t.tolist() for t in local_shards(d)] == [[1, 1, 1, 1], [1, 1, 1, 1]]


def test_a_plain_tensor_is_its_own_single_shard():
    t = torch.arange(3)
    assert len(local_shards(t)) == 1 and local_shards(t)[0] is t


def _one_shard(rank: int, world: int) -> list:
    mesh = init_device_mesh("cpu", (world,))
    d = distribute_tensor(torch.arange(5.0), mesh, (Shard(0),))
    shards = local_shards(d)
    return [t.tolist() for t in shards]


@pytest.mark.slow
def test_real_process_group_gives_this_ranks_one_shard():
    assert run_gloo(_one_shard, 2) == [[[0.0, 1.0, 2.0]], [[3.0, 4.0]]]

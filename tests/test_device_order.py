"""``device_order``'s two forms mean one thing: mesh dims major (splits first) to minor, as upstream's
``shard_order``. Checked on a 2x2x2 simulated mesh against nested ``torch.chunk`` of the full tensor."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.distributed.tensor import Replicate, Shard

from dtensor_rules.redistribute import Layout, distribute_tensor
from dtensor_rules.testing import local_shards, simulated_mesh

MESH = (2, 2, 2)


def chunked(full: torch.Tensor, coord: tuple[int, ...], splits: dict[int, tuple[int, ...]]) -> torch.Tensor:
    """The oracle: for each tensor dim, chunk by its mesh dims in the listed order (torch.chunk sizes)."""
    t = full
    for dim, mesh_dims in splits.items():
        for m in mesh_dims:
            pieces = torch.chunk(t, MESH[m], dim=dim)
            t = pieces[coord[m]] if coord[m] < len(pieces) else t.narrow(dim, 0, 0)
    return t


def held(full: torch.Tensor, placements, device_order) -> list[torch.Tensor]:
    with simulated_mesh(MESH) as mesh:
        return local_shards(distribute_tensor(full, mesh, placements, device_order=device_order))


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
def test_tuple_and_dict_forms_give_the_nested_chunks_of_the_listed_order(order):
    full = torch.arange(7 * 3).reshape(7, 3)  # 7 rows: uneven at every level
    by_tuple = held(full, (Shard(0),) * 3, order)
    by_dict = held(full, (Shard(0),) * 3, {0: order})
    coords = list(itertools.product(*[range(s) for s in MESH]))  # rank r = row-major mesh coordinate
    for r, c in enumerate(coords):
        expected = chunked(full, c, {0: order})
        assert torch.equal(by_tuple[r], expected), (order, c)
        assert torch.equal(by_dict[r], expected), (order, c)


def test_tuple_form_orders_each_tensor_dim_by_its_own_mesh_dims():
    full = torch.arange(6 * 5).reshape(6, 5)
    placements = (Shard(1), Shard(0), Shard(1))
    by_tuple = held(full, placements, (2, 1, 0))  # tensor dim 1: mesh dim 2 first, then 0
    by_dict = held(full, placements, {0: (1,), 1: (2, 0)})
    for r, c in enumerate(itertools.product(*[range(s) for s in MESH])):
        expected = chunked(full, c, {0: (1,), 1: (2, 0)})
        assert torch.equal(by_tuple[r], expected) and torch.equal(by_dict[r], expected), c


def test_the_two_forms_build_the_same_layout():
    assert Layout.from_placements((Shard(0),) * 3, 1, (1, 2, 0)) == Layout.from_placements((Shard(0),) * 3, 1, {0: (1, 2, 0)})
    assert Layout.from_placements((Shard(0), Replicate(), Shard(0)), 1, (2, 1, 0)).orders == ((2, 0),)


def test_a_tuple_that_is_not_a_permutation_names_the_convention():
    with pytest.raises(ValueError, match="mesh dims from major to minor"):
        Layout.from_placements((Shard(0),) * 3, 1, (0, 0, 1))

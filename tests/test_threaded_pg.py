"""Calls in sequence on upstream's threaded process group: no cache carries one rank's data to another.

The threaded process group (``torch.testing._internal.distributed.multi_threaded_pg``, what
upstream's ``DTensorOpTestBase``-style tests run on) runs every rank as a thread of one process.
Thread idents are recycled when one world's threads exit and the next world's start, and a
``DeviceMesh`` compares and hashes by its creating thread's ident, so a cache keyed by mesh can
hand rank 2 what rank 0 stored. Each world here runs the same calls as upstream's
``test_dtensor_op_db_gather`` then ``..._take_along_dim`` would, compared on every rank with
plain torch on the full tensors; later worlds are the ones a rank-blind cache breaks.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

import dtensor_rules  # noqa: F401  (installs the rules)
from tests._thread_ranks import run_on_thread_ranks

WORLD = 4


def _gather_then_take_along_dim() -> None:
    mesh = init_device_mesh("cpu", (WORLD,))
    g = torch.Generator().manual_seed(0)
    table = torch.randn(4, 4, generator=g)
    cases = [
        ("gather", lambda t, i: torch.gather(t, 1, i), torch.tensor([[3, 1]])),
        ("take_along_dim", lambda t, i: torch.take_along_dim(t, i, 1), torch.tensor([[0, 2]])),
        ("gather uneven", lambda t, i: torch.gather(t, 1, i), torch.tensor([[2], [0], [3], [1]])),
    ]
    for name, fn, index in cases:
        for table_full in (table, table[:, :3]):  # even (1 column a rank) and uneven (rank 3 empty)
            index_full = index.clamp(max=table_full.shape[1] - 1)
            dt = distribute_tensor(table_full, mesh, [Shard(1)])
            di = distribute_tensor(index_full, mesh, [Replicate()])
            got = fn(dt, di).full_tensor()
            want = fn(table_full, index_full)
            assert torch.equal(got, want), f"{name} {tuple(table_full.shape)}: {got.tolist()} != {want.tolist()}"


def _gather_on_2d_mesh() -> None:
    mesh = init_device_mesh("cpu", (2, 2))
    g = torch.Generator().manual_seed(1)
    table = torch.randn(6, 7, generator=g)
    index = torch.randint(0, 7, (6, 1), generator=g)
    for placements in ([Shard(1), Shard(1)], [Replicate(), Shard(1)], [Shard(1), Replicate()]):
        dt = distribute_tensor(table, mesh, placements)
        di = distribute_tensor(index, mesh, [Replicate(), Replicate()])
        got = torch.gather(dt, 1, di).full_tensor()
        assert torch.equal(got, torch.gather(table, 1, index)), f"{placements}: {got.tolist()}"


@pytest.mark.parametrize("body", [_gather_then_take_along_dim, _gather_on_2d_mesh], ids=lambda f: f.__name__)
def test_masked_gather_in_successive_thread_worlds_equals_plain_torch(body: Callable[[], None]) -> None:
    for world in range(3):  # each world's threads reuse the idents of the one before
        try:
            run_on_thread_ranks(body, WORLD)
        except AssertionError as e:
            raise AssertionError(f"world {world}, {e}") from e

"""simulated_mesh and run_gloo: shapes, errors, and real multi-process collectives."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import Shard, distribute_tensor

from dtensor_rules.testing import fake_world, run_gloo, simulated_mesh


def _all_reduce_rank(rank: int, world: int) -> float:
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    return float(t)


def _fail_on_rank_1(rank: int, world: int) -> int:
    if rank == 1:
        raise ValueError("rank one refuses")
    return rank


def _die_on_rank_0(rank: int, world: int) -> int:
    if rank == 0:
        os._exit(3)
    return rank


@pytest.mark.slow
def test_run_gloo_runs_real_collectives():
    assert run_gloo(_all_reduce_rank, 3) == [3.0, 3.0, 3.0]


@pytest.mark.slow
def test_run_gloo_reports_the_failing_rank_with_its_traceback():
    with pytest.raises(RuntimeError, match=r"rank 1 failed:(.|\n)*ValueError: rank one refuses"):
        run_gloo(_fail_on_rank_1, 2)


@pytest.mark.slow
def test_run_gloo_detects_a_rank_that_died():
    with pytest.raises(RuntimeError, match=r"gloo rank\(s\) \[0\] died without a result \(exit codes \[3\]\)"):
        run_gloo(_die_on_rank_0, 2, timeout=120)


@pytest.mark.parametrize("shape", [(2,), (4,), (2, 2), (2, 3), (2, 2, 2)])
def test_simulated_mesh_holds_every_rank(shape):
    with simulated_mesh(shape) as mesh:
        assert tuple(mesh.shape) == shape
        x = torch.arange(7.0 * 5).reshape(7, 5)  # uneven on every mesh above
        d = distribute_tensor(x, mesh, [Shard(0)] + [Shard(1)] * (len(shape) - 1))
        torch.testing.assert_close(d.full_tensor()._local_tensors[0], x)


@pytest.mark.parametrize(
    "shape, message",
    [((8, 9), "72 ranks; simulated meshes allow at most 64"), ((2, 0), "positive ints"), ((1, 1, 1, 1), "1 to 3")],
)
def test_simulated_mesh_rejects_bad_shapes(shape, message):
    with pytest.raises(ValueError, match=message):
        with simulated_mesh(shape):
            pass


def test_simulated_mesh_names_must_match_dims():
    with pytest.raises(ValueError, match="2 mesh dim names given for a 1-D mesh"):
        with simulated_mesh((2,), names=("a", "b")):
            pass


def test_fake_world_is_restored_after_a_nested_size():
    with fake_world(4):
        with fake_world(2):
            assert dist.get_world_size() == 2
        assert dist.get_world_size() == 4
    assert not dist.is_initialized()

"""simulated_mesh and run_gloo: shapes, errors, and real multi-process collectives."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

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


def test_a_nested_simulated_mesh_of_another_size_is_refused_at_once():
    with simulated_mesh((2,)) as outer:
        with pytest.raises(RuntimeError, match=r"simulated_mesh\(\(2, 2\)\) \(4 ranks\) cannot open inside a simulated "
                                               r"mesh of 2 ranks: .*close the outer block first"):
            with simulated_mesh((2, 2)):
                pass
        x = torch.arange(6.0)  # the outer mesh still works
        torch.testing.assert_close(distribute_tensor(x, outer, [Shard(0)]).full_tensor()._local_tensors[1], x)
    with simulated_mesh((2, 2)):  # and the refused size opens once the outer block is closed
        pass


def test_a_nested_simulated_mesh_of_the_same_size_works():
    x = torch.arange(6.0)
    with simulated_mesh((4,)) as outer:
        with simulated_mesh((2, 2)) as inner:
            d = distribute_tensor(x, inner, [Shard(0), Replicate()])
            torch.testing.assert_close(d.full_tensor()._local_tensors[3], x)
        torch.testing.assert_close(distribute_tensor(x, outer, [Shard(0)]).full_tensor()._local_tensors[2], x)


def test_inductors_failure_on_a_local_tensor_leaves_the_block_as_one_clear_error():
    """What inductor raises on a LocalTensor (the real compile: the slow test below)."""
    with pytest.raises(RuntimeError, match=COMPILE_UNSUPPORTED_START) as info:
        with simulated_mesh((2,)):
            raise RuntimeError("backend='inductor' raised:\nRuntimeError: Cannot access data pointer of Tensor (e.g. FakeTensor)")
    assert "Cannot access data pointer" in str(info.value.__cause__)
    with pytest.raises(RuntimeError, match="^an unrelated failure$"):  # other errors pass through as they are
        with simulated_mesh((2,)):
            raise RuntimeError("an unrelated failure")


@pytest.mark.slow  # an inductor compile
def test_compiling_with_inductor_on_a_simulated_mesh_says_what_works():
    torch._dynamo.reset()
    with pytest.raises(RuntimeError, match=COMPILE_UNSUPPORTED_START + r".*run_gloo"):
        with simulated_mesh((2,)) as mesh:
            x = distribute_tensor(torch.randn(8, 4), mesh, [Shard(0)])
            torch.compile(lambda t: (t * 2).sin())(x)


COMPILE_UNSUPPORTED_START = r"^torch.compile with the inductor backend cannot compile DTensor code on a simulated mesh"

"""Flattened plan steps run as ONE collective on the flattened group, exact on uneven nested shards."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from torch.distributed.tensor import Partial, Replicate, Shard

from dtensor_rules.redistribute import Layout, distribute_tensor, plan, redistribute
from dtensor_rules.redistribute import flat
from dtensor_rules.testing import run_gloo, simulated_mesh
from dtensor_rules.testing.layout_strategies import layout_pairs

from tests._redistribute_helpers import check_locals, int_tensor

# (mesh, shape, src, dst, expected flattened collective); non-ascending groups like (1, 0) need
# the group-rank -> nested-index reordering; sides 5 and 7 are uneven on 4 ranks
CASES = [
    ((2, 2), (5, 3), ((Shard(0), Shard(0)), (1, 0)), ((Replicate(), Replicate()), None), "all_gather"),
    ((2, 2), (5, 3), ((Shard(0), Shard(0)), None), ((Replicate(), Replicate()), None), "all_gather"),
    ((2, 2), (5, 7), ((Shard(0), Shard(0)), (1, 0)), ((Shard(1), Shard(1)), (1, 0)), "all_to_all"),
    ((2, 2), (5, 3), ((Partial(), Partial()), None), ((Shard(0), Shard(0)), (1, 0)), "reduce_scatter"),
    ((2, 2), (5, 3), ((Partial(), Partial()), None), ((Replicate(), Replicate()), None), "all_reduce"),
    ((2, 2, 2), (7, 3), ((Shard(0), Shard(0), Shard(0)), (2, 0, 1)), ((Shard(0), Replicate(), Replicate()), None),
     "all_gather"),
    ((2, 4), (3, 9), ((Shard(1), Shard(1)), (1, 0)), ((Shard(0), Shard(0)), (1, 0)), "all_to_all"),
]


def _spy(monkeypatch) -> list[str]:
    calls: list[str] = []
    for name in ("all_gather", "all_to_all", "reduce_scatter", "all_reduce"):
        fn = getattr(flat, name)
        monkeypatch.setattr(flat, name, lambda *a, _fn=fn, _n=name, **k: (calls.append(_n), _fn(*a, **k))[1])
    return calls


def _run(mesh_shape, shape, src, dst, seed=0):
    x = int_tensor(shape, seed)
    with simulated_mesh(mesh_shape) as mesh:
        a = distribute_tensor(x, mesh, src[0], src[1])
        b = redistribute(a, dst[0], dst[1])
        lay = Layout.from_placements(dst[0], len(shape), dst[1])
        check_locals(b._local_tensor._local_tensors, x, lay, mesh_shape)


@pytest.mark.parametrize("mesh_shape,shape,src,dst,kind", CASES)
def test_flattened_step_is_one_collective_and_exact(monkeypatch, mesh_shape, shape, src, dst, kind):
    p = plan(mesh_shape, shape, torch.float32, src[0], dst[0], src_device_order=src[1], dst_device_order=dst[1])
    flat_steps = [s.collective for s in p.steps if len(s.mesh_dims) > 1]
    assert kind in flat_steps, p.explain()
    calls = _spy(monkeypatch)
    _run(mesh_shape, shape, src, dst)
    assert kind in calls
    # every flattened step of both plans (distribute_tensor's and redistribute's) went through one call
    assert len(calls) >= len(flat_steps)


@given(layout_pairs(mesh_shapes=((2, 2), (2, 4), (2, 2, 2)), max_tensor_ndim=2))
def test_random_pairs_fused_execution_is_exact(case):
    mesh_shape, shape, src, dst = case
    _run(mesh_shape, shape, src, dst, seed=3)


def test_unsupported_mesh_falls_back_to_the_sequence(monkeypatch):
    """A mesh whose rank tensor does not ascend (group rank order != mixed radix) uses the lowered sequence."""
    from torch.distributed.device_mesh import DeviceMesh

    calls = _spy(monkeypatch)
    x = int_tensor((5, 3))
    with simulated_mesh((2, 2)):
        mesh = DeviceMesh("cpu", torch.tensor([[0, 2], [1, 3]]))
        assert not flat.supported(mesh)
        a = distribute_tensor(x, mesh, (Shard(0), Shard(0)), (1, 0))
        b = redistribute(a, (Replicate(), Replicate()))
        for t in b._local_tensor._local_tensors.values():
            torch.testing.assert_close(t, x, rtol=0, atol=0)
    assert calls == []


def _gloo_worker(rank, world, cases):
    from torch.distributed.device_mesh import init_device_mesh

    from dtensor_rules.redistribute import local_shard_offsets

    mesh = init_device_mesh("cpu", (2, 2))
    assert flat.supported(mesh)
    for mesh_shape, shape, src, dst, _ in cases:
        x = int_tensor(shape, 0)
        a = distribute_tensor(x, mesh, src[0], src[1])
        b = redistribute(a, dst[0], dst[1])
        lay = Layout.from_placements(dst[0], len(shape), dst[1])
        size, off = local_shard_offsets(lay, mesh_shape, shape, mesh.get_coordinate())
        torch.testing.assert_close(b.to_local(), x[tuple(slice(o, o + s) for o, s in zip(off, size))], rtol=0, atol=0)
    return True


# Partial avg/max/min on gloo (no AVG in gloo): flattened reduce_scatter / all_reduce and single-dim reduces
GLOO_REDUCE_OPS = [
    ((2, 2), (5, 3), ((Partial(op), Partial(op)), None), ((Shard(0), Shard(0)), (1, 0)), "reduce_scatter")
    for op in ("avg", "max", "min")
] + [((2, 2), (5, 3), ((Partial(op), Shard(0)), None), ((Replicate(), Shard(1)), None), "single") for op in ("avg", "max")]


@pytest.mark.slow
def test_gloo_flattened_steps_exact():
    """All (2, 2) cases (gather, all_to_all, reduce_scatter, all_reduce on uneven sizes; sum/avg/max/min)
    in one gloo world of 4."""
    assert run_gloo(_gloo_worker, 4, [c for c in CASES if c[0] == (2, 2)] + GLOO_REDUCE_OPS) == [True] * 4


def test_flat_groups_are_cached_per_mesh_and_not_stored_on_it():
    """Nothing is added to the mesh (its __getstate__ pickles __dict__; ProcessGroups cannot be pickled)."""
    with simulated_mesh((2, 2)) as mesh:
        before = set(vars(mesh))
        pg = flat.flat_group(mesh, (1, 0))
        assert flat.flat_group(mesh, (0, 1)) is pg
        assert set(vars(mesh)) == before

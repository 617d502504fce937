"""Plans executed on simulated meshes give every rank exactly its expected shard."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from torch.distributed.tensor import Partial, Replicate, Shard

from dtensor_rules.redistribute import Layout, distribute_tensor, layout_of, plan, redistribute
from dtensor_rules.testing import simulated_mesh
from dtensor_rules.testing.layout_strategies import layout_pairs

from tests._redistribute_helpers import check_locals, int_tensor


def _run_pair(mesh_shape, shape, src, dst, seed=0):
    x = int_tensor(shape, seed)
    with simulated_mesh(mesh_shape) as mesh:
        a = distribute_tensor(x, mesh, src[0], src[1])
        check_locals(a._local_tensor._local_tensors, x, Layout.from_placements(src[0], len(shape), src[1]), mesh_shape)
        b = redistribute(a, dst[0], dst[1])
        lay = Layout.from_placements(dst[0], len(shape), dst[1])
        assert layout_of(b._spec) == lay
        check_locals(b._local_tensor._local_tensors, x, lay, mesh_shape)
        if not lay.partial:
            full = b.full_tensor()  # upstream's own path must read our recorded order correctly
            for r, t in full._local_tensors.items():
                torch.testing.assert_close(t, x, rtol=0, atol=0)


@given(layout_pairs())
def test_random_pairs_exact_shards(case):
    mesh_shape, shape, src, dst = case
    _run_pair(mesh_shape, shape, src, dst)


def test_seed_worked_example_even_and_uneven():
    # S(0)S(0)S(0) order [0,1,2] -> R S(0) S(0) order [2,0,1] (seed design doc)
    for n in (16, 5, 3):
        _run_pair((2, 2, 2), (n, 3), ((Shard(0),) * 3, (0, 1, 2)), ((Replicate(), Shard(0), Shard(0)), (2, 0, 1)))


def test_dims_smaller_than_mesh():
    _run_pair((2, 4), (1, 3), ((Shard(1), Shard(0)), (1, 0)), ((Shard(0), Shard(1)), (0, 1)))
    _run_pair((2, 2, 2), (1, 2), ((Shard(1), Shard(1), Shard(0)), (2, 1, 0)), ((Shard(0), Shard(0), Shard(1)), (1, 0, 2)))


def test_partial_sources_reduce_correctly():
    _run_pair((2, 2, 2), (5, 6), ((Partial(), Shard(1), Partial()), (0, 1, 2)), ((Shard(1), Shard(0), Shard(1)), (2, 1, 0)))


def test_flattened_step_is_planned_and_exact_on_uneven():
    # gathering a whole order in one flattened step is cheaper (one latency) and must stay exact
    p = plan((2, 2, 2), (7, 3), torch.float32, (Shard(0),) * 3, (Replicate(),) * 3)
    assert [s.collective for s in p.steps] == ["all_gather"] and p.steps[0].mesh_dims == (0, 1, 2)
    _run_pair((2, 2, 2), (7, 3), ((Shard(0),) * 3, (1, 2, 0)), ((Replicate(),) * 3, None))


def test_autograd_flows_through_reverse_plan():
    x = int_tensor((6, 5), 1).requires_grad_(True)
    w = int_tensor((6, 5), 2)
    with simulated_mesh((2, 2)) as mesh:
        a = distribute_tensor(x, mesh, (Shard(0), Shard(0)), (1, 0))
        b = redistribute(a, (Shard(1), Replicate()))
        wd = distribute_tensor(w, mesh, (Shard(1), Replicate()))
        (b * wd).sum().backward()
        # the reverse plan returns the gradient in the input's (ordered) layout; note: upstream's
        # AccumulateGrad (detach via sharding propagation) drops shard_order from a.grad's spec metadata
        check_locals(a.grad._local_tensor._local_tensors, w, layout_of(a._spec), (2, 2))


@given(layout_pairs(reduce_ops=("avg", "max", "min")))
def test_random_pairs_exact_shards_avg_max_min(case):
    mesh_shape, shape, src, dst = case
    _run_pair(mesh_shape, shape, src, dst, seed=5)


@pytest.mark.parametrize("op", ["sum", "avg", "max", "min"])
@pytest.mark.parametrize(
    "mesh_shape,shape,src,dst",
    [
        # flattened reduce_scatter into a non-ascending order, uneven
        ((2, 2, 2), (7, 3), (("P", "P", Shard(1)), None), ((Shard(0), Shard(0), Shard(1)), (1, 0, 2))),
        # flattened all_reduce to replicate
        ((2, 2), (5, 3), (("P", "P"), None), ((Replicate(), Replicate()), None)),
        # Partial kept on one dim, reduced on the other
        ((2, 4), (5, 6), (("P", "P"), None), (("P", Shard(1)), None)),
        # Replicate -> Partial destination
        ((2, 2), (3, 5), ((Shard(0), Replicate()), (1, 0)), ((Shard(1), "P"), None)),
    ],
)
def test_partial_reduce_ops_sources_and_destinations(op, mesh_shape, shape, src, dst):
    def sub(pl):
        return tuple(Partial(op) if p == "P" else p for p in pl)

    _run_pair(mesh_shape, shape, (sub(src[0]), src[1]), (sub(dst[0]), dst[1]), seed=7)

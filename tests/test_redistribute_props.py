"""Planner properties: triangle inequality, monotone in size, brute-force optimum, memory cap, upstream costs."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dtensor_rules.redistribute import Layout, NoPlanError, Topology, plan
from dtensor_rules.redistribute.planner import PlanContext, moves
from dtensor_rules.testing.layout_strategies import layout_args, layout_pairs

TWO_TIER = {(2, 2): Topology.node_aware((2, 2), 2), (2, 4): Topology.node_aware((2, 4), 4),
            (2, 2, 2): Topology.node_aware((2, 2, 2), 4)}


def _cost(mesh, shape, a, b, topo=None):
    return plan(mesh, shape, torch.float32, a[0], b[0], src_device_order=a[1], dst_device_order=b[1], topology=topo).cost_us
@given(layout_pairs(partial=False), st.data())
def test_triangle_inequality(case, data):
    mesh, shape, a, c = case
    b = data.draw(layout_args(len(mesh), len(shape), partial=False))
    topo = TWO_TIER[mesh]
    assert _cost(mesh, shape, a, c, topo) <= _cost(mesh, shape, a, b, topo) + _cost(mesh, shape, b, c, topo) + 1e-9
@given(layout_pairs(), st.integers(2, 5))
def test_cost_grows_with_tensor_size(case, factor):
    mesh, shape, a, b = case
    big = tuple(s * factor for s in shape)
    assert _cost(mesh, shape, a, b) <= _cost(mesh, big, a, b) + 1e-9


def _brute_force(ctx: PlanContext, src, dst) -> float:
    """Bellman-Ford over every reachable state with the same move set."""
    dist = {src: 0.0}
    frontier = [src]
    edges = {}
    while frontier:  # enumerate the reachable graph
        nxt = []
        for s in frontier:
            edges[s] = [(mv[0], mv[6]) for mv in moves(ctx, s, dst[1])]
            for ns, _ in edges[s]:
                if ns not in dist:
                    dist[ns] = math.inf
                    nxt.append(ns)
        frontier = nxt
    for _ in range(len(edges)):
        changed = False
        for s, es in edges.items():
            for ns, c in es:
                if dist[s] + c < dist[ns] - 1e-12:
                    dist[ns] = dist[s] + c
                    changed = True
        if not changed:
            break
    return dist[dst]


@given(layout_pairs(mesh_shapes=((2, 2), (2, 4), (2, 2, 2)), max_tensor_ndim=2))
def test_plan_matches_brute_force_optimum(case):
    mesh, shape, a, b = case
    topo = TWO_TIER[mesh]
    la = Layout.from_placements(a[0], len(shape), a[1])
    lb = Layout.from_placements(b[0], len(shape), b[1])
    ctx = PlanContext(mesh, shape, 4, topo)
    assert _cost(mesh, shape, a, b, topo) == pytest.approx(_brute_force(ctx, la.state, lb.state), rel=1e-9, abs=1e-9)
@given(layout_pairs(partial=False), st.floats(0.0, 1.5))
def test_cap_is_respected_or_raises(case, frac):
    mesh, shape, a, b = case
    full = math.prod(shape) * 4
    cap = int(full * frac)
    try:
        p = plan(mesh, shape, torch.float32, a[0], b[0], src_device_order=a[1], dst_device_order=b[1], max_peak_bytes=cap)
    except NoPlanError as e:  # refusing is allowed, with an error that names the cap
        assert "max_peak_bytes" in str(e)
    else:
        assert p.peak_bytes <= cap


def test_cap_changes_plan_instead_of_gathering_everything():
    from torch.distributed.tensor import Shard

    mesh, shape = (2, 2), (8, 8)
    free = plan(mesh, shape, torch.float32, (Shard(0), Shard(1)), (Shard(1), Shard(0)))
    capped = plan(mesh, shape, torch.float32, (Shard(0), Shard(1)), (Shard(1), Shard(0)), max_peak_bytes=64)
    assert capped.peak_bytes <= 64 < 8 * 8 * 4
    assert capped.cost_us >= free.cost_us


def test_upstream_like_topology_matches_one_step_redistribute_cost():
    """Our single-dim step costs equal torch's own one_step_redistribute_cost (the benchmark relies on it)."""
    import torch.distributed as dist
    from dtensor_rules._upstream import one_step_redistribute_cost
    from dtensor_rules._upstream import DTensorSpec, TensorMeta

    from dtensor_rules.testing import fake_world
    from torch.distributed.device_mesh import DeviceMesh

    mesh_shape, shape = (2, 4, 2), (16, 32, 8)
    with fake_world(16):
        mesh = DeviceMesh("cpu", torch.arange(16).reshape(mesh_shape))
        ctx = PlanContext(mesh_shape, shape, 4, Topology.upstream_like(mesh_shape), flatten=False)
        t = torch.empty(shape, device="meta")
        meta = TensorMeta(t.shape, t.stride(), torch.float32)
        from torch.distributed.tensor import Partial, Shard
        start = Layout.from_placements((Partial(), Shard(1), Shard(1)), 3, (0, 2, 1))
        n = 0
        for mv in moves(ctx, start.state, 0):
            nxt = Layout.from_state(mv[0], 3)
            spec = lambda l: DTensorSpec(mesh, l.placements, tensor_meta=meta, shard_order=l.shard_order(),
                                         use_strided_shard_as_shard_order=False)
            assert mv[6] == pytest.approx(one_step_redistribute_cost(spec(start), spec(nxt)), rel=1e-12), mv
            n += 1
        assert n > 5
        assert dist.is_initialized()


def _dist_to(ctx: PlanContext, src, dst) -> dict:
    """Exact cost-to-go to ``dst`` of every state reachable from ``src`` (Dijkstra on reversed edges)."""
    import heapq

    rev: dict = {}
    seen, frontier = {src}, [src]
    while frontier:
        nxt = []
        for s in frontier:
            for mv in moves(ctx, s, dst[1]):
                rev.setdefault(mv[0], []).append((s, mv[6]))
                if mv[0] not in seen:
                    seen.add(mv[0])
                    nxt.append(mv[0])
        frontier = nxt
    dist = {dst: 0.0}
    pq = [(0.0, 0, dst)]
    k = 0
    while pq:
        d, _, s = heapq.heappop(pq)
        if d > dist[s]:
            continue
        for p, c in rev.get(s, ()):
            if d + c < dist.get(p, math.inf):
                dist[p] = d + c
                k += 1
                heapq.heappush(pq, (d + c, k, p))
    return dist


@st.composite
def _even_pairs(draw):
    """Pairs whose every tensor dim divides by the world size (the data-volume bound is active)."""
    mesh = draw(st.sampled_from([(2, 2), (2, 4), (2, 2, 2)]))
    world = math.prod(mesh)
    ndim = draw(st.integers(1, 3))
    shape = tuple(world * draw(st.integers(1, 3)) for _ in range(ndim))
    a = draw(layout_args(len(mesh), ndim))
    b = draw(layout_args(len(mesh), ndim))
    return mesh, shape, a, b


@given(_even_pairs(), st.sampled_from(["two_tier", "upstream_like"]))
def test_heuristic_is_admissible_on_every_reachable_state(case, topo_name):
    """h(s) <= exact cost-to-go for every state, on even shapes where the data-volume bound applies."""
    assert PlanContext(case[0], case[1], 4, Topology.uniform(len(case[0]))).even
    _check_admissible(case, topo_name)


def _check_admissible(case, topo_name) -> None:
    """h(s) <= the exact cost-to-go (Dijkstra) on every reachable state, and plan() finds the optimum."""
    from dtensor_rules.redistribute.planner import heuristic

    mesh, shape, a, b = case
    topo = TWO_TIER[mesh] if topo_name == "two_tier" else Topology.upstream_like(mesh, devices_per_host=2)
    la = Layout.from_placements(a[0], len(shape), a[1])
    lb = Layout.from_placements(b[0], len(shape), b[1])
    ctx = PlanContext(mesh, shape, 4, topo)
    dist = _dist_to(ctx, la.state, lb.state)
    ctx.set_target(lb.state)
    for s, d in dist.items():
        assert heuristic(ctx, s, lb.state) <= d * (1 + 1e-9) + 1e-9, (s, d, ctx.bound_shape, ctx.kappa)
    assert _cost(mesh, shape, a, b, topo) == pytest.approx(dist[la.state], rel=1e-9, abs=1e-9)


@st.composite
def _uneven_pairs(draw):
    """Pairs with uneven, tiny (smaller than the mesh), size-1 and empty dims: both uneven bounds get used."""
    mesh = draw(st.sampled_from([(2, 2), (2, 4), (2, 2, 2)]))
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.sampled_from([0, 1, 3, 5, 7, 9, 13, 33])) for _ in range(ndim))
    return mesh, shape, draw(layout_args(len(mesh), ndim)), draw(layout_args(len(mesh), ndim))


@given(_uneven_pairs(), st.sampled_from(["two_tier", "upstream_like"]))
def test_heuristic_is_admissible_on_uneven_shapes(case, topo_name):
    """The uneven data bound (shrunk even shape or kappa-scaled) never overestimates the cost-to-go."""
    _check_admissible(case, topo_name)


@given(_uneven_pairs())
def test_rank_pieces_match_local_shard_offsets(case):
    """The planner's vectorised per-rank pieces are DTensor's nested-chunk shards."""
    from dtensor_rules.redistribute import local_shard_offsets

    mesh, shape, a, _ = case
    lay = Layout.from_placements(a[0], len(shape), a[1])
    ctx = PlanContext(mesh, shape, 4, Topology.uniform(len(mesh)))
    ctx.set_target(lay.state)
    ctx.bound_shape, ctx._iv = shape, {}  # the real (uneven) shape, whichever the bound picked
    for r, coord in enumerate(ctx.coords):
        size, off = local_shard_offsets(lay, mesh, shape, tuple(int(c) for c in coord))
        for d, ms in enumerate(lay.orders):
            start, length = ctx.pieces(d, ms)
            assert (int(length[r]), int(start[r]) if length[r] else None) == (size[d], off[d] if size[d] else None)


def test_kappa_is_one_on_even_shapes_and_grows_on_tiny_dims():
    from dtensor_rules.redistribute.planner import _kappa

    assert _kappa((2, 2, 2, 2), (64, 128, 128, 64)) == 1.0
    assert 1.0 < _kappa((2, 2, 2, 2), (33, 49, 97, 129)) < 1.5
    assert _kappa((2, 2, 2, 2), (1, 64)) == 16.0  # a size-1 dim scattered over 16 ranks


def test_data_bound_geometry_picks_a_valid_stronger_shape():
    """Shrunk even shape: every largest piece is at most the real one's, so its costs lower-bound ours."""
    from dtensor_rules.redistribute.planner import _data_bound_geometry

    assert _data_bound_geometry((2, 2, 2, 2), (64, 128)) == ((64, 128), 1.0)
    assert _data_bound_geometry((2, 2, 2, 2), (33, 49, 97, 129)) == ((32, 48, 96, 128), 1.0)
    shape, kappa = _data_bound_geometry((2, 2, 2, 2), (3, 5, 97, 129))  # dims < world: shrinking empties them
    assert shape == (3, 5, 97, 129) and kappa > 1
    for size in (1, 3, 5, 9, 13, 33, 97):
        for world in (2, 4, 8, 16):
            shrunk = world * (size // world)
            for p in (1, 2, 4, 8, 16):
                if world % p == 0:
                    assert shrunk // p <= -(-size // p)

"""``Plan.explain()`` for the seed's worked example: each step's bytes and cost follow from the tensor's
size, the layouts and the ring-collective formulas of the two-tier topology, derived here by hand.

The example: a 1024x256 fp32 tensor (1 MiB) on a 2x2x2 mesh with 4 devices a node, so mesh dims 1
and 2 (4 ranks) are intra-node (450 GB/s, 0.6 us a hop) and mesh dim 0 crosses nodes (25 GB/s, 5 us).
"""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import Replicate, Shard

from dtensor_rules.redistribute import Topology, plan

MESH = (2, 2, 2)
SHAPE = (1024, 256)
FULL_BYTES = 1024 * 256 * 4
INTRA = (450.0, 0.6)  # (GB/s, us a hop): Topology.node_aware's defaults inside a node
INTER = (25.0, 5.0)  # ... and across nodes
TOPOLOGY = Topology.node_aware(MESH, 4)


def _ring_us(ranks: int, tier: tuple[float, float], nbytes: int) -> float:
    """A ring all_gather / all_to_all (no a2a penalty in node_aware): 6.6 us base, a hop's latency
    per other rank, and (ranks-1)/ranks of the bytes at the tier's bandwidth (bytes counted in GiB)."""
    bandwidth, latency = tier
    return 6.6 + (ranks - 1) * latency + (ranks - 1) / ranks * nbytes / 2**30 / bandwidth * 1e6


def _assert_explained(p, start: str, want: list[tuple[str, tuple[int, ...], int, float, str]]) -> None:  # noqa: ANN001
    """From layout ``start``, the plan's steps are ``want`` (collective, mesh dims, bytes a rank, cost, layout after), its total
    is their sum, and ``explain()`` prints one row a step with exactly these values."""
    got = [(s.collective, s.mesh_dims, s.bytes, s.cost_us, s.after_text) for s in p.steps]
    assert [g[:3] + g[4:] for g in got] == [w[:3] + w[4:] for w in want]
    assert [g[3] for g in got] == pytest.approx([w[3] for w in want], rel=1e-9)
    assert p.cost_us == pytest.approx(sum(w[3] for w in want), rel=1e-9)
    lines = p.explain().splitlines()
    assert lines[0].split() == ["step", "collective", "mesh", "dims", "bytes", "cost_us", "layout", "after"]
    assert lines[1].split() == ["0", "start", start]
    for i, (kind, dims, nbytes, cost, after) in enumerate(want, 1):
        assert lines[1 + i].split() == [str(i), kind, f"({','.join(map(str, dims))})", str(nbytes), f"{cost:.1f}", after]
    assert lines[-1] == (f"total {sum(w[3] for w in want):.1f} us, peak {p.peak_bytes} bytes/rank, "
                         f"mesh {MESH}, shape {SHAPE}")
    assert len(lines) == len(want) + 3


def test_seed_example_explain() -> None:
    p = plan(MESH, SHAPE, torch.float32, (Shard(0),) * 3, (Replicate(), Shard(0), Shard(0)),
             src_device_order=(0, 1, 2), dst_device_order=(1, 2, 0), topology=TOPOLOGY)
    # rows split 8 ways -> an all_to_all over the node's 4 ranks moves each rank's 1/8 into columns;
    # the all_gather over the node pair yields a 1/4 (all rows, a quarter of the columns); the last
    # all_to_all turns those columns back into rows in the target's device order
    _assert_explained(p, "S(0)[0,1,2]", [
        ("all_to_all", (1, 2), FULL_BYTES // 8, _ring_us(4, INTRA, FULL_BYTES // 8), "S(0)S(1)[1,2]"),
        ("all_gather", (0,), FULL_BYTES // 4, _ring_us(2, INTER, FULL_BYTES // 4), "RS(1)[1,2]"),
        ("all_to_all", (1, 2), FULL_BYTES // 4, _ring_us(4, INTRA, FULL_BYTES // 4), "RS(0)[1,2]"),
    ])
    assert p.peak_bytes == FULL_BYTES // 4  # the largest shard any step holds: the gathered quarter


def test_seed_example_single_dim_moves_only() -> None:
    from dtensor_rules.redistribute.layout import Layout
    from dtensor_rules.redistribute.planner import PlanContext, build_plan

    src = Layout.from_placements((Shard(0),) * 3, 2, (0, 1, 2))
    dst = Layout.from_placements((Replicate(), Shard(0), Shard(0)), 2, (1, 2, 0))
    ctx = PlanContext(MESH, SHAPE, 4, TOPOLOGY, flatten=False)
    p = build_plan(ctx, src.state, dst.state, "sum", None)
    # one mesh dim a step: the same move costs a step more and gathers a half on the way
    _assert_explained(p, "S(0)[0,1,2]", [
        ("all_to_all", (2,), FULL_BYTES // 8, _ring_us(2, INTRA, FULL_BYTES // 8), "S(0)[0,1]S(1)"),
        ("all_gather", (1,), FULL_BYTES // 4, _ring_us(2, INTRA, FULL_BYTES // 4), "S(0)RS(1)"),
        ("all_gather", (0,), FULL_BYTES // 2, _ring_us(2, INTER, FULL_BYTES // 2), "RRS(1)"),
        ("chunk", (1,), 0, 0.0, "RS(0)S(1)"),
        ("all_to_all", (2,), FULL_BYTES // 4, _ring_us(2, INTRA, FULL_BYTES // 4), "RS(0)[1,2]"),
    ])
    assert p.peak_bytes == FULL_BYTES // 2

"""strategy_costs: the per-strategy table a solver consumes."""

from __future__ import annotations

import math

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.placement_types import Partial, Placement, Replicate, Shard
from torch.utils import _pytree as pytree

import dtensor_rules  # noqa: F401
from dtensor_rules.costs import Hardware, estimate, format_strategy_costs, strategy_costs
from dtensor_rules.registry import rules
from dtensor_rules.testing import fake_world

aten = torch.ops.aten
from dtensor_rules.op_rules.fma import fma as FMA  # noqa: E402  (defines prims.fma: dtensor_rules imports inductor lazily)
GOLDEN_HW = Hardware("golden", memory_bandwidth=1e9, vector={"fp32": 1e9}, compute_efficiency=1.0,
                     memory_efficiency=1.0, launch_s=1e-6)


@pytest.fixture
def mesh2():
    with fake_world(2):
        yield init_device_mesh("cpu", (2,))


@pytest.fixture
def mesh22():
    with fake_world(4):
        yield init_device_mesh("cpu", (2, 2))


def _is_shard_only(row) -> bool:
    pls = [p for ps in row.output_placements + row.input_placements for p in ps]
    return all(isinstance(p, (Shard, Replicate)) for p in pls) and any(isinstance(p, Shard) for p in row.output_placements[0])


@pytest.mark.parametrize("shape", [(4, 6), (5, 7)])  # even and uneven
def test_fma_shard_rank_costs_sum_to_global(mesh22, shape) -> None:
    a, b, c = torch.randn(shape), torch.randn(shape[1]), torch.randn(shape)
    glob = estimate(FMA, a, b, c)
    rows = strategy_costs(FMA, (a, b, c), {}, mesh22)
    sharded = [r for r in rows if _is_shard_only(r)]
    assert sharded
    for r in sharded:
        # mesh dims where the output is Replicate hold copies: each copy does the work again
        copies = 1
        for size, p in zip((2, 2), r.output_placements[0]):
            copies *= size if isinstance(p, Replicate) else 1
        assert sum(rc.flops for rc in r.rank_costs) == copies * glob.flops
        # the output is split exactly; replicated operands are read on every rank
        assert sum(rc.bytes_written for rc in r.rank_costs) == copies * glob.bytes_written
        assert sum(rc.bytes_read for rc in r.rank_costs) >= copies * glob.bytes_read


def test_softmax_backward_table(mesh2) -> None:
    g = torch.randn(6, 8)
    rows = strategy_costs(aten._softmax_backward_data.default, (g, g, 1, torch.float32), {}, mesh2, hardware="h100")
    glob = estimate(aten._softmax_backward_data.default, g, g, 1, torch.float32)
    outs = {r.output_placements[0][0] for r in rows}
    assert outs == {Replicate(), Shard(0), Partial("sum"), Partial("avg")}
    shard = next(r for r in rows if r.output_placements[0][0] == Shard(0))
    assert [rc.flops for rc in shard.rank_costs] == [glob.flops // 2] * 2
    assert all(r.compute_s > 0 for r in rows)


def test_redistribute_cost_from_current_placements(mesh2) -> None:
    a = torch.randn(64, 64)
    rows = strategy_costs(FMA, (a, a, a), {}, mesh2, input_placements=[(Shard(0),)] * 3)
    by_out = {r.output_placements[0][0]: r for r in rows}
    assert sum(by_out[Shard(0)].redistribute_s) == 0
    assert all(x > 0 for x in by_out[Replicate()].redistribute_s)  # all-gathers


def test_every_rule_with_a_sample_suite_gets_a_table(mesh22) -> None:
    from dtensor_rules.testing.suites import samples_for, suites

    ops = [op for op in suites() if op in rules()]
    assert aten.cat.default in ops and aten.index.Tensor in ops and aten.bincount.default in ops
    for op in ops:
        args, kwargs = samples_for(op)[0]
        rows = strategy_costs(op, args, kwargs, mesh22)
        n_tensors = sum(isinstance(t, torch.Tensor) for t in pytree.tree_leaves((args, kwargs)))
        assert rows, op
        assert all(len(r.input_placements) == n_tensors == len(r.redistribute_s) for r in rows), op


def test_cat_counts_every_tensor_in_the_list(mesh2) -> None:
    a, b = torch.randn(4, 6), torch.randn(4, 2)
    glob = estimate(aten.cat.default, [a, b], 1)
    rows = strategy_costs(aten.cat.default, ([a, b], 1), {}, mesh2, input_placements=[(Shard(0),), (Replicate(),)])
    by_in = {r.input_placements: r for r in rows}
    row = by_in[((Shard(0),), (Shard(0),))]  # row-sharded cat along columns: each rank does half
    assert row.output_placements == ((Shard(0),),)
    assert [(c.bytes_read, c.bytes_written) for c in row.rank_costs] == [(glob.bytes_read // 2, glob.bytes_written // 2)] * 2
    assert row.redistribute_s[0] == 0 and row.redistribute_s[1] == 0  # R -> S(0) is a local chunk
    repl = by_in[((Replicate(),), (Replicate(),))]
    assert repl.redistribute_s[0] > 0  # all-gather of a
    assert repl.rank_costs[0] == glob


def test_index_with_none_and_tensor_indices(mesh2) -> None:
    x, idx = torch.randn(8, 6), torch.tensor([0, 5, 2])
    glob = estimate(aten.index.Tensor, x, [None, idx])
    rows = strategy_costs(aten.index.Tensor, (x, [None, idx]), {}, mesh2)
    assert all(len(r.input_placements) == 2 for r in rows)  # x and idx; the None is skipped
    row = next(r for r in rows if r.input_placements == ((Shard(0),), (Replicate(),)))
    assert row.output_placements == ((Shard(0),),)
    # rows of x split in half: each rank gathers 4 x 3 elements and reads all of idx
    assert [c.bytes_written for c in row.rank_costs] == [4 * 3 * 4] * 2 == [glob.bytes_written // 2] * 2


def test_bad_input_placements(mesh2) -> None:
    from dtensor_rules.costs import CostError

    a = torch.randn(4, 4)
    with pytest.raises(CostError, match="input_placements"):
        strategy_costs(FMA, (a, a, a), {}, mesh2, input_placements=[(Shard(0),)])


# ------------------------------------------------------------ whole tables, every number derived by hand
# On GOLDEN_HW a rank's compute is 1 us of launch plus max(flops, bytes) / 1e9 s (1 GFLOP/s, 1 GB/s, no
# efficiency loss). Redistribution is upstream's redistribute_cost: torch's MeshTopoInfo on CPU counts
# one device a host, so the 2-rank mesh dim crosses hosts (87.7 GB/s x 0.22, 2.7 us a hop, 6.6 us base).
UPSTREAM_CROSS_HOST_GBPS, UPSTREAM_HOP_US, UPSTREAM_BASE_US = 87.7 * 0.22, 2.7, 6.6
RANKS = 2
US = 1e-6  # strategy_costs reports seconds


def _all_gather_us(out_bytes: int) -> float:
    return UPSTREAM_BASE_US + (RANKS - 1) * UPSTREAM_HOP_US + (RANKS - 1) / RANKS * out_bytes / 2**30 / UPSTREAM_CROSS_HOST_GBPS * 1e6


def _move_us(src: Placement, dst: Placement, full_bytes: int) -> float:
    """Upstream's price of moving one operand from ``src`` to ``dst`` on the 2-rank mesh dim."""
    if src == dst:
        return 0.0
    if dst.is_partial():  # only a replicated value can become a Partial (every rank keeps it: no traffic)
        return 0.0 if src.is_replicate() else math.inf
    if src.is_replicate():  # R -> S: each rank keeps its chunk
        return 0.0
    if dst.is_replicate():  # S -> R: all_gather of the full tensor
        return _all_gather_us(full_bytes)
    return _all_gather_us(full_bytes // RANKS) + 1.0  # S -> S: upstream prices all_to_all as an all_gather of a shard, + 1 us


def _local_numel(shape: tuple[int, ...], p: Placement) -> int:
    return math.prod(shape) // (RANKS if isinstance(p, Shard) else 1)  # (even shapes: every rank holds the same)


def _fmt(ps: tuple[Placement, ...]) -> str:
    return "".join(map(str, ps))


def _assert_table(rows, current, shapes, out_shape, elem_bytes, cost, layouts) -> None:  # noqa: ANN001
    """``rows`` are ``layouts`` ((output, inputs) as the table prints them), with every number derived:
    ``cost(local input numels, local output numel) -> (flops, bytes)`` per rank; compute and
    redistribution as above; and ``format_strategy_costs`` prints exactly those numbers."""
    assert [(_fmt(r.output_placements[0]), ",".join(_fmt(p) for p in r.input_placements)) for r in rows] == layouts
    lines = format_strategy_costs(rows).splitlines()
    assert lines[0].split() == ["output", "inputs", "flops/rank", "bytes/rank", "compute_us", "redistribute_us", "total_us"]
    for r, line in zip(rows, lines[1:], strict=True):
        ins = [p[0] for p in r.input_placements]
        flops, nbytes = cost([_local_numel(s, p) for s, p in zip(shapes, ins)], _local_numel(out_shape, r.output_placements[0][0]))
        assert (r.local_cost.flops, r.local_cost.bytes) == (flops, nbytes), line
        compute_us = 1.0 + max(flops, nbytes) / 1e9 * 1e6
        moves_us = [_move_us(c, p, math.prod(s) * b) for c, p, s, b in zip(current, ins, shapes, elem_bytes)]
        assert r.compute_s / US == pytest.approx(compute_us, rel=1e-9), line
        assert [x / US for x in r.redistribute_s] == pytest.approx(moves_us, rel=1e-9), line
        total = compute_us + sum(moves_us)
        assert line.split()[2:] == [str(flops), str(nbytes), f"{compute_us:.3f}", ",".join(f"{x:.1f}" for x in moves_us),
                                    "inf" if math.isinf(total) else f"{total:.3f}"]


def test_fma_table_on_two_ranks(mesh2) -> None:
    a, b, c = torch.randn(1024, 256), torch.randn(256), torch.randn(1024, 256)
    current = [Shard(0), Replicate(), Shard(1)]
    rows = strategy_costs(FMA, (a, b, c), {}, mesh2, hardware=GOLDEN_HW, input_placements=[(p,) for p in current])
    _assert_table(
        rows, current, [a.shape, b.shape, c.shape], (1024, 256), [4, 4, 4],
        # a multiply and an add per output element; reads every local operand, writes the output
        lambda ins, out: (2 * out, 4 * (sum(ins) + out)),
        [("R", "R,R,R"), ("S(0)", "S(0),R,S(0)"), ("S(1)", "S(1),S(0),S(1)"),
         ("P(sum)", "P(sum),R,P(sum)"), ("P(sum)", "R,P(sum),P(sum)"),
         ("P(avg)", "P(avg),R,P(avg)"), ("P(avg)", "R,P(avg),P(avg)"), ("P(avg)", "P(avg),R,R"),
         ("P(avg)", "R,P(avg),R"), ("P(avg)", "R,R,P(avg)"), ("P(max)", "R,R,P(max)"), ("P(min)", "R,R,P(min)")],
    )


def test_cat_table_on_two_ranks(mesh2) -> None:
    a, b = torch.randn(256, 64), torch.randn(256, 32)
    current = [Shard(0), Replicate()]
    rows = strategy_costs(aten.cat.default, ([a, b], 1), {}, mesh2, hardware=GOLDEN_HW, input_placements=[(p,) for p in current])
    _assert_table(
        rows, current, [a.shape, b.shape], (256, 96), [4, 4],
        lambda ins, out: (0, 4 * (sum(ins) + out)),  # a copy: reads both pieces, writes the result
        [("R", "R,R"), ("S(0)", "S(0),S(0)"), ("P(sum)", "P(sum),P(sum)"),
         ("P(avg)", "P(avg),R"), ("P(avg)", "R,P(avg)"), ("P(avg)", "P(avg),P(avg)"),
         ("P(max)", "P(max),R"), ("P(max)", "R,P(max)"), ("P(max)", "P(max),P(max)"),
         ("P(min)", "P(min),R"), ("P(min)", "R,P(min)"), ("P(min)", "P(min),P(min)")],
    )


def test_index_table_on_two_ranks(mesh2) -> None:
    x, idx = torch.randn(256, 64), torch.randint(0, 256, (100,))
    current = [Shard(1), Replicate()]
    rows = strategy_costs(aten.index.Tensor, (x, [idx]), {}, mesh2, hardware=GOLDEN_HW, input_placements=[(p,) for p in current])
    _assert_table(
        rows, current, [x.shape, idx.shape], (100, 64), [4, 8],
        # a gather reads only the rows it picks (as many as it writes) and the int64 index
        lambda ins, out: (0, 4 * out + 8 * ins[1] + 4 * out),
        [("R", "R,R"), ("S(1)", "S(1),R"), ("S(0)", "R,S(0)"),
         ("P(sum)", "P(sum),R"), ("P(avg)", "P(avg),R"), ("P(max)", "P(max),R"), ("P(min)", "P(min),R")],
    )

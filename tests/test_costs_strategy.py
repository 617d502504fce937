"""strategy_costs: the per-strategy table a solver consumes."""

from __future__ import annotations

import pytest
import torch
from expecttest import TestCase
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.placement_types import Partial, Replicate, Shard
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


class TestGolden(TestCase):
    def test_fma_table_on_two_ranks(self) -> None:
        with fake_world(2):
            mesh = init_device_mesh("cpu", (2,))
            a, b, c = torch.randn(1024, 256), torch.randn(256), torch.randn(1024, 256)
            rows = strategy_costs(
                FMA, (a, b, c), {}, mesh, hardware=GOLDEN_HW,
                input_placements=[(Shard(0),), (Replicate(),), (Shard(1),)],
            )
        self.assertExpectedInline(format_strategy_costs(rows), """\
output  inputs           flops/rank  bytes/rank  compute_us  redistribute_us  total_us
R       R,R,R            524288      3146752     3147.752    34.6,0.0,34.6    3216.967
S(0)    S(0),R,S(0)      262144      1573888     1574.888    0.0,0.0,23.0     1597.842
S(1)    S(1),S(0),S(1)   262144      1573376     1574.376    23.0,0.0,0.0     1597.330
P(sum)  P(sum),R,P(sum)  524288      3146752     3147.752    inf,0.0,inf      inf
P(sum)  R,P(sum),P(sum)  524288      3146752     3147.752    34.6,0.0,inf     inf
P(avg)  P(avg),R,P(avg)  524288      3146752     3147.752    inf,0.0,inf      inf
P(avg)  R,P(avg),P(avg)  524288      3146752     3147.752    34.6,0.0,inf     inf
P(avg)  P(avg),R,R       524288      3146752     3147.752    inf,0.0,34.6     inf
P(avg)  R,P(avg),R       524288      3146752     3147.752    34.6,0.0,34.6    3216.967
P(avg)  R,R,P(avg)       524288      3146752     3147.752    34.6,0.0,inf     inf
P(max)  R,R,P(max)       524288      3146752     3147.752    34.6,0.0,inf     inf
P(min)  R,R,P(min)       524288      3146752     3147.752    34.6,0.0,inf     inf""")


class TestGoldenLists(TestCase):
    def test_cat_and_index_tables_on_two_ranks(self) -> None:
        with fake_world(2):
            mesh = init_device_mesh("cpu", (2,))
            a, b = torch.randn(256, 64), torch.randn(256, 32)
            cat = strategy_costs(aten.cat.default, ([a, b], 1), {}, mesh, hardware=GOLDEN_HW,
                                 input_placements=[(Shard(0),), (Replicate(),)])
            x, idx = torch.randn(256, 64), torch.randint(0, 256, (100,))
            index = strategy_costs(aten.index.Tensor, (x, [idx]), {}, mesh, hardware=GOLDEN_HW,
                                   input_placements=[(Shard(1),), (Replicate(),)])
        self.assertExpectedInline(format_strategy_costs(cat), """\
output  inputs         flops/rank  bytes/rank  compute_us  redistribute_us  total_us
R       R,R            0           196608      197.608     10.9,0.0         208.490
S(0)    S(0),S(0)      0           98304       99.304      0.0,0.0          99.304
P(sum)  P(sum),P(sum)  0           196608      197.608     inf,0.0          inf
P(avg)  P(avg),R       0           196608      197.608     inf,0.0          inf
P(avg)  R,P(avg)       0           196608      197.608     10.9,0.0         208.490
P(avg)  P(avg),P(avg)  0           196608      197.608     inf,0.0          inf
P(max)  P(max),R       0           196608      197.608     inf,0.0          inf
P(max)  R,P(max)       0           196608      197.608     10.9,0.0         208.490
P(max)  P(max),P(max)  0           196608      197.608     inf,0.0          inf
P(min)  P(min),R       0           196608      197.608     inf,0.0          inf
P(min)  R,P(min)       0           196608      197.608     10.9,0.0         208.490
P(min)  P(min),P(min)  0           196608      197.608     inf,0.0          inf""")
        self.assertExpectedInline(format_strategy_costs(index), """\
output  inputs    flops/rank  bytes/rank  compute_us  redistribute_us  total_us
R       R,R       0           52000       53.000      10.9,0.0         63.882
S(1)    S(1),R    0           26400       27.400      0.0,0.0          27.400
S(0)    R,S(0)    0           26000       27.000      10.9,0.0         37.882
P(sum)  P(sum),R  0           52000       53.000      inf,0.0          inf
P(avg)  P(avg),R  0           52000       53.000      inf,0.0          inf
P(max)  P(max),R  0           52000       53.000      inf,0.0          inf
P(min)  P(min),R  0           52000       53.000      inf,0.0          inf""")

"""Golden explain() table for the seed's worked example."""

from __future__ import annotations

import torch
from expecttest import TestCase
from torch.distributed.tensor import Replicate, Shard

from dtensor_rules.redistribute import Topology, plan


class TestExplain(TestCase):
    def test_seed_example_explain(self):
        p = plan((2, 2, 2), (1024, 256), torch.float32, (Shard(0),) * 3, (Replicate(), Shard(0), Shard(0)),
                 src_device_order=(0, 1, 2), dst_device_order=(1, 2, 0), topology=Topology.node_aware((2, 2, 2), 4))
        self.assertExpectedInline(p.explain(), """\
step  collective  mesh dims  bytes   cost_us  layout after
0     start                                   S(0)[0,1,2]
1     all_to_all  (1,2)      131072  8.6      S(0)S(1)[1,2]
2     all_gather  (0)        262144  16.5     RS(1)[1,2]
3     all_to_all  (1,2)      262144  8.8      RS(0)[1,2]
total 33.9 us, peak 262144 bytes/rank, mesh (2, 2, 2), shape (1024, 256)""")

    def test_seed_example_single_dim_moves_only(self):
        from dtensor_rules.redistribute.layout import Layout
        from dtensor_rules.redistribute.planner import PlanContext, build_plan

        src = Layout.from_placements((Shard(0),) * 3, 2, (0, 1, 2))
        dst = Layout.from_placements((Replicate(), Shard(0), Shard(0)), 2, (1, 2, 0))
        ctx = PlanContext((2, 2, 2), (1024, 256), 4, Topology.node_aware((2, 2, 2), 4), flatten=False)
        self.assertExpectedInline(build_plan(ctx, src.state, dst.state, "sum", None).explain(), """\
step  collective  mesh dims  bytes   cost_us  layout after
0     start                                   S(0)[0,1,2]
1     all_to_all  (2)        131072  7.3      S(0)[0,1]S(1)
2     all_gather  (1)        262144  7.5      S(0)RS(1)
3     all_gather  (0)        524288  21.4     RRS(1)
4     chunk       (1)        0       0.0      RS(0)S(1)
5     all_to_all  (2)        262144  7.5      RS(0)[1,2]
total 43.6 us, peak 524288 bytes/rank, mesh (2, 2, 2), shape (1024, 256)""")

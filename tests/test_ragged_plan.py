"""Planner moves of the ragged placement: explain() tables (golden), alpha-beta costs written out
by hand from the Topology table, and the dispatch's bytes against the rows the move really sends."""

from __future__ import annotations

import pytest
import torch
from expecttest import TestCase
from torch.distributed.tensor import Partial, Replicate, Shard

from dtensor_rules import ragged
from dtensor_rules._upstream import rank_map, rank_tensors
from dtensor_rules.ragged import RaggedShard
from dtensor_rules.redistribute import Topology, plan
from dtensor_rules.redistribute.ragged_steps import ragged_move_cost
from dtensor_rules.redistribute.steps import NoPlanError
from dtensor_rules.testing import simulated_mesh

RU, RA = RaggedShard(0, 8, False), RaggedShard(0, 8, True)
GIB = 1024**3


def _a2a_by_hand(n: int, nbytes: float, bw: float = 87.7, lat: float = 0.6, base: float = 6.6) -> float:
    return base + (n - 1) * lat + (nbytes / GIB * (n - 1) / n) / bw * 1e6


def _ag_by_hand(n: int, nbytes_out: float, bw: float = 87.7, lat: float = 0.6, base: float = 6.6) -> float:
    return base + (n - 1) * lat + (nbytes_out / GIB * (n - 1) / n) / bw * 1e6


class TestRaggedExplain(TestCase):
    def test_dispatch_and_combine(self) -> None:
        self.assertExpectedInline(plan((4,), (4096, 512), torch.bfloat16, (RU,), (RA,)).explain(), """\
step  collective  mesh dims  bytes    cost_us  layout after
0     start                                    RU(0)
1     dispatch    (0)        1048576  25.2     RA(0)
total 25.2 us, peak 1048576 bytes/rank, mesh (4,), shape (4096, 512)""")
        self.assertExpectedInline(plan((4,), (4096, 512), torch.bfloat16, (RA,), (RU,)).explain(), """\
step  collective  mesh dims  bytes    cost_us  layout after
0     start                                    RA(0)
1     combine     (0)        1048576  16.8     RU(0)
total 16.8 us, peak 1048576 bytes/rank, mesh (4,), shape (4096, 512)""")

    def test_gather_then_the_other_mesh_dims_and_partial_then_select(self) -> None:
        self.assertExpectedInline(
            plan((4, 2), (4096, 512), torch.bfloat16, (RU, Replicate()), (Shard(0), Shard(1))).explain(), """\
step  collective    mesh dims  bytes    cost_us  layout after
0     start                                      RU(0)R
1     all_gather_v  (0)        4194304  50.2     RR
2     chunk         (0)        0        0.0      S(0)R
3     chunk         (1)        0        0.0      S(0)S(1)
total 50.2 us, peak 4194304 bytes/rank, mesh (4, 2), shape (4096, 512)""")
        self.assertExpectedInline(
            plan((4, 2), (4096, 512), torch.bfloat16, (Shard(0), Partial()), (RA, Replicate())).explain(), """\
step  collective  mesh dims  bytes    cost_us  layout after
0     start                                    S(0)P
1     all_reduce  (1)        1048576  18.9     S(0)R
2     all_gather  (0)        4194304  41.8     RR
3     select      (0)        0        0.0      RA(0)R
total 60.7 us, peak 4194304 bytes/rank, mesh (4, 2), shape (4096, 512)""")


def test_costs_follow_the_alpha_beta_table() -> None:
    topo = Topology.uniform(2)
    rows, row_bytes, E = 4096, 1024, 8
    tokens = rows * row_bytes / 4
    dispatch = ragged_move_cost("dispatch", topo, (4, 2), 0, rows, row_bytes, E, sync_us=30.0)
    assert dispatch.bytes == tokens
    assert dispatch.cost_us == pytest.approx(_a2a_by_hand(4, 8 * E) + 30.0 + _a2a_by_hand(4, tokens))
    combine = ragged_move_cost("combine", topo, (4, 2), 0, rows, row_bytes, E, skew=1.5)
    assert combine.bytes == 1.5 * tokens and combine.cost_us == pytest.approx(_a2a_by_hand(4, 1.5 * tokens))
    gather = ragged_move_cost("all_gather_v", topo, (4, 2), 0, rows, row_bytes, E)
    assert gather.cost_us == pytest.approx(_ag_by_hand(4, 8 * 4 * E) + _ag_by_hand(4, rows * row_bytes))
    assert ragged_move_cost("select", topo, (4, 2), 0, rows, row_bytes, E) == (0, 0.0)
    with pytest.raises(ValueError, match="skew"):
        ragged_move_cost("combine", topo, (4, 2), 0, rows, row_bytes, E, skew=0.5)


def test_dispatch_bytes_equal_the_rows_each_rank_sends_under_an_even_routing() -> None:
    C = [[2, 1, 0, 3, 1, 1, 0, 0]] * 4  # every rank routes 8 rows: the expected-value model's skew = 1
    width, dtype = 16, torch.bfloat16
    n = 32
    p = plan((4,), (n, width), dtype, (RU,), (RA,))
    with simulated_mesh(4) as mesh:
        counts = ragged.counts_from_local(rank_map(lambda r: torch.tensor(C[r])), mesh, 0)
        x = ragged.distribute(torch.zeros(n, width, dtype=dtype), mesh, counts, 0)
        sent = {r: t.numel() * t.element_size() for r, t in rank_tensors(x.to_local()).items()}
    assert set(sent.values()) == {p.steps[0].bytes}


def test_two_ragged_mesh_dims_have_no_plan() -> None:
    with pytest.raises(NoPlanError, match="exactly one mesh dim"):
        plan((2, 2), (64, 4), torch.float32, (RU, RU), (Replicate(), Replicate()))
    with pytest.raises(ValueError, match="default device order"):
        plan((4,), (64, 4), torch.float32, (RU,), (RA,), max_peak_bytes=10)

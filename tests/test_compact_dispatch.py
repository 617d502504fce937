"""The compact dispatch of fma / softmax backward: queries see every row, dispatch a subset, and the
zero-redistribution path gives single-device results with no communication."""

from __future__ import annotations

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.debug import CommDebugMode

import dtensor_rules  # noqa: F401
from dtensor_rules._upstream import TensorMeta
from dtensor_rules.ops import _compact_dispatch as cd
from dtensor_rules.ops.fma import fma, fma_strategy
from dtensor_rules.ops.softmax import SOFTMAX_BACKWARD
from dtensor_rules.testing import simulated_mesh
from dtensor_rules.testing.dispatch import full_value, to_dtensor

SBD = SOFTMAX_BACKWARD[0]


def _meta(t: torch.Tensor) -> TensorMeta:
    return TensorMeta(t.shape, t.stride(), t.dtype)


def test_queries_see_every_row_dispatch_only_carried_partials() -> None:
    x = torch.empty(4, 6)
    metas = (_meta(x), _meta(x), _meta(x))
    full = fma_strategy(fma, metas, {})
    assert any(isinstance(r[0], Partial) and r[0].reduce_op == "avg" for r in full)
    token = cd._CARRIED.set((frozenset({Partial("sum")}), frozenset({Replicate()}), frozenset({Partial("sum")})))
    try:
        narrowed = fma_strategy(fma, metas, {})
    finally:
        cd._CARRIED.reset(token)
    partial_rows = [r for r in narrowed if any(isinstance(p, Partial) for p in r)]
    assert partial_rows == [[Partial("sum"), Partial("sum"), Replicate(), Partial("sum")]]
    assert {repr(r) for r in narrowed} <= {repr(r) for r in full}  # only drops rows, never adds one


def test_exact_output_per_mesh_dim() -> None:
    x = torch.empty(4, 6)
    rows = fma_strategy(fma, (_meta(x), _meta(x), _meta(x)), {})
    S0, R, P = Shard(0), Replicate(), Partial("sum")
    assert cd.exact_output(rows, 1, [(S0, R), (S0, R), (S0, R)]) == [S0, R]
    assert cd.exact_output(rows, 1, [(P, S0), (R, S0), (P, S0)]) == [P, S0]
    assert cd.exact_output(rows, 1, [(S0,), (Shard(1),), (R,)]) is None  # needs a redistribution


PLACEMENTS = [Replicate(), Shard(0), Shard(1), Partial("sum"), Partial("avg"), Partial("max")]


@settings(max_examples=8, deadline=None)
@given(pa=st.lists(st.sampled_from(PLACEMENTS), min_size=2, max_size=2),
       pc=st.lists(st.sampled_from(PLACEMENTS), min_size=2, max_size=2), seed=st.integers(0, 1000))
def test_fma_dispatch_matches_single_device_and_exact_matches_do_not_communicate(pa, pc, seed) -> None:  # noqa: ANN001
    for pl in (pa, pc):  # DTensor refuses mixed Partial reduce ops in one placement list
        assume(len({p.reduce_op for p in pl if isinstance(p, Partial)}) <= 1)
    g = torch.Generator().manual_seed(seed)
    a, b, c = torch.randn(5, 6, generator=g), torch.randn(6, generator=g), torch.randn(5, 6, generator=g)
    with simulated_mesh((2, 2)) as mesh:
        da, db, dc = to_dtensor(a, mesh, pa), to_dtensor(b, mesh, [Replicate()] * 2), to_dtensor(c, mesh, pc, salt=1)
        rows = fma_strategy(fma, (_meta(a), _meta(b), _meta(c)), {})
        exact = cd.exact_output(rows, 1, [da.placements, db.placements, dc.placements])
        with CommDebugMode() as comm:
            out = fma(da, db, dc)
        if exact is not None:
            assert tuple(out.placements) == tuple(exact) and comm.get_total_counts() == 0
        torch.testing.assert_close(full_value(out), fma(full_value(da), full_value(db), full_value(dc)), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("pg, py", [((Shard(1), Replicate()), (Shard(0), Replicate())), ((Partial("sum"), Shard(0)), (Replicate(), Shard(0)))])
def test_softmax_backward_dispatch(pg, py) -> None:  # noqa: ANN001
    grad, y = torch.randn(6, 5), torch.randn(6, 5).softmax(1)
    with simulated_mesh((2, 2)) as mesh:
        dg, dy = to_dtensor(grad, mesh, list(pg)), to_dtensor(y, mesh, list(py))
        out = SBD(dg, dy, 1, torch.float32)
        torch.testing.assert_close(full_value(out), SBD(full_value(dg), full_value(dy), 1, torch.float32), atol=1e-5, rtol=1e-5)

"""Property: over random routings (uneven, empty partitions, ranks sending or receiving nothing),
dispatch / combine / gather / select agree with the plain-Python oracle of the two layouts, and the
gradient of a round trip equals the one-device gradient."""

from __future__ import annotations

import torch
from hypothesis import given, strategies as st

from dtensor_rules import ragged
from dtensor_rules._upstream import rank_map, rank_tensors
from dtensor_rules.testing import simulated_mesh
from torch.distributed.tensor import Replicate, distribute_tensor

from tests._ragged_oracle import rows_of


@st.composite
def routings(draw: st.DrawFn) -> list[list[int]]:
    ep = draw(st.sampled_from([1, 2, 4]))
    E = ep * draw(st.integers(1, 3))
    return [[draw(st.integers(0, 4)) for _ in range(E)] for _ in range(ep)]


def _locals_match(dt, full: torch.Tensor, C: list[list[int]], aligned: bool) -> bool:
    return all(torch.equal(t, full[torch.tensor(rows_of(C, r, aligned), dtype=torch.long)])
               for r, t in (rank_tensors(dt.to_local()) or {0: dt.to_local()}).items())


@given(C=routings(), width=st.integers(1, 3), dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.int64]))
def test_moves_match_the_oracle_on_random_routings(C: list[list[int]], width: int, dtype: torch.dtype) -> None:
    n = sum(map(sum, C))
    full = torch.arange(n * width).reshape(n, width).to(dtype)
    ep = len(C)
    with simulated_mesh(ep) as mesh:
        counts = ragged.counts_from_local(rank_map(lambda r: torch.tensor(C[r])), mesh, 0)
        x = ragged.distribute(full, mesh, counts, 0)
        assert _locals_match(x, full, C, False)
        y = ragged.dispatch(x)
        assert _locals_match(y, full, C, True)
        assert _locals_match(ragged.combine(y), full, C, False)
        for t in (x, y):
            got = ragged.gather(t).to_local()
            assert all(torch.equal(g, full) for g in (rank_tensors(got) or {0: got}).values())


@given(C=routings())
def test_round_trip_gradient_equals_one_device(C: list[list[int]]) -> None:
    n = sum(map(sum, C))
    full = torch.randn(n, 2)
    w = torch.randn(n, 2)
    leaf = full.clone().requires_grad_()
    (leaf.tanh() * w).sum().backward()
    with simulated_mesh(len(C)) as mesh:
        counts = ragged.counts_from_local(rank_map(lambda r: torch.tensor(C[r])), mesh, 0)
        rep = distribute_tensor(full, mesh, [Replicate()]).requires_grad_()
        out = ragged.combine(ragged.dispatch(ragged.distribute(rep, mesh, counts, 0))).full_tensor()
        (out.tanh() * w).sum().backward()
        grads = rank_tensors(rep.grad.to_local()) or {0: rep.grad.to_local()}
        for g in grads.values():
            torch.testing.assert_close(g, leaf.grad)

"""Ops on ragged DTensors (issue 19 item 3): the expert SwiGLU between dispatch and combine, against plain torch.

The block's middle, ``_grouped_mm`` on aligned tokens with experts ``Shard(0)``, ``silu``, ``mul``, a
cast and the routing-weight multiply, runs on simulated meshes (ep=2, ep=4, ep x tp) with the routing
matrices of ``tests/_ragged_oracle.CASES`` (uneven partitions, empty experts, a rank that sends nothing,
a rank whose experts receive nothing). Oracle: the same function on one device on the full tensors
(``full_tensor()`` of the result, every gradient).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

import dtensor_rules
from dtensor_rules import ragged
from dtensor_rules._upstream.ragged import RaggedPlacementError
from dtensor_rules.ragged import RaggedShard
from dtensor_rules.testing import simulated_mesh

from tests._ragged_oracle import CASES

D, H = 16, 8


@pytest.fixture(autouse=True)
def _installed():
    dtensor_rules.install()
    yield


def _swiglu(x, w1, w3, w2, offs, weights):
    a = torch._grouped_mm(x, w1, offs)
    h = F.silu(a) * torch._grouped_mm(x, w3, offs) + a * 0.5
    return (torch._grouped_mm(h, w2, offs).float() * weights).to(x.dtype)


def _inputs(C, dtype):
    torch.manual_seed(len(C))
    E, rows = len(C[0]), sum(map(sum, C))
    full = [torch.randn(rows, D), torch.randn(E, D, H) / 4, torch.randn(E, D, H) / 4, torch.randn(E, H, D) / 4]
    full = [t.to(dtype) for t in full] + [torch.rand(rows, 1)]
    offs = torch.tensor(C).sum(0).cumsum(0).to(torch.int32)
    return full, offs, torch.randn(rows, D).to(dtype)


def _check(mesh, C, dtype, w_places, ep_dim=0):
    full, offs_full, grad = _inputs(C, dtype)
    E = len(C[0])
    rep = [distribute_tensor(t, mesh, [Replicate()] * mesh.ndim).requires_grad_() for t in (full[0], full[4])]
    ws = [distribute_tensor(w, mesh, p).requires_grad_() for w, p in zip(full[1:4], w_places)]
    counts = distribute_tensor(torch.tensor(C), mesh, [Replicate()] * mesh.ndim)
    offs = distribute_tensor(offs_full, mesh, [Replicate()] * mesh.ndim)
    aligned = [RaggedShard(0, E, aligned=True) if i == ep_dim else Replicate() for i in range(mesh.ndim)]
    # tokens and their routing weights, unaligned, then dispatched (aligned) by placements
    x, wt = (ragged.distribute(t, mesh, counts, mesh_dim=ep_dim).redistribute(mesh, aligned) for t in rep)
    out = _swiglu(x, *ws, offs, wt)
    assert out.placements[ep_dim] == RaggedShard(0, E, aligned=True)
    assert ragged.context_of(out) is not None  # the combine needs the sizes
    back = out.redistribute(mesh, [RaggedShard(0, E, aligned=False) if i == ep_dim else p
                                   for i, p in enumerate(out.placements)])  # the combine
    one = [t.clone().requires_grad_() for t in full]
    want = _swiglu(one[0], *one[1:4], offs_full, one[4])
    got = back.full_tensor()
    torch.testing.assert_close(got, want)
    (got.float() * grad.float()).sum().backward()
    (want.float() * grad.float()).sum().backward()
    for d, o in zip(rep + ws, [one[0], one[4], *one[1:4]]):
        torch.testing.assert_close(d.grad.full_tensor(), o.grad)
    for w in ws:  # expert gradients stay sharded on the EP dim like the experts
        assert w.grad.placements[ep_dim] == Shard(0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("ep", [2, 4])
def test_expert_swiglu_on_aligned_tokens(ep, dtype):
    with simulated_mesh(ep) as mesh:
        _check(mesh, CASES[ep], dtype, [[Shard(0)]] * 3)


@pytest.mark.parametrize("ep_dim", [0, 1])
def test_expert_swiglu_ep_x_tp(ep_dim):
    # experts Shard(0) on ep, column/row split on tp: w2's output is Partial over tp
    places = [[Shard(0), Shard(2)], [Shard(0), Shard(2)], [Shard(0), Shard(1)]]
    if ep_dim == 1:
        places = [p[::-1] for p in places]
    with simulated_mesh((2, 2)) as mesh:
        _check(mesh, CASES[2], torch.float32, places, ep_dim)


def test_tp_partial_output_placement():
    C = CASES[2]
    full, offs_full, _ = _inputs(C, torch.float32)
    with simulated_mesh((2, 2)) as mesh:
        counts = distribute_tensor(torch.tensor(C), mesh, [Replicate(), Replicate()])
        x = ragged.distribute(distribute_tensor(full[0], mesh, [Replicate(), Replicate()]), mesh, counts, mesh_dim=0)
        x = x.redistribute(mesh, [RaggedShard(0, 4, aligned=True), Replicate()])
        offs = distribute_tensor(offs_full, mesh, [Replicate(), Replicate()])
        h = torch._grouped_mm(x, distribute_tensor(full[1], mesh, [Shard(0), Shard(2)]), offs)
        assert h.placements == (RaggedShard(0, 4, aligned=True), Shard(1))
        y = torch._grouped_mm(h, distribute_tensor(full[3], mesh, [Shard(0), Shard(1)]), offs)
        assert y.placements == (RaggedShard(0, 4, aligned=True), Partial())
        torch.testing.assert_close(y.full_tensor(), torch._grouped_mm(torch._grouped_mm(full[0], full[1], offs_full),
                                                                      full[3], offs_full))


def test_reduction_over_ragged_rows_is_partial():
    C = CASES[2]
    full = torch.randn(sum(map(sum, C)), D)
    with simulated_mesh(2) as mesh:
        counts = distribute_tensor(torch.tensor(C), mesh, [Replicate()])
        x = ragged.distribute(distribute_tensor(full, mesh, [Replicate()]), mesh, counts, mesh_dim=0)
        s = x.sum(0)
        assert s.placements == (Partial(),)
        torch.testing.assert_close(s.full_tensor(), full.sum(0))


def test_refusals_name_the_fix():
    C = CASES[2]
    full, offs_full, _ = _inputs(C, torch.float32)
    with simulated_mesh(2) as mesh:
        counts = distribute_tensor(torch.tensor(C), mesh, [Replicate()])
        rep = distribute_tensor(full[0], mesh, [Replicate()])
        x = ragged.distribute(rep, mesh, counts, mesh_dim=0)
        w1 = distribute_tensor(full[1], mesh, [Shard(0)])
        offs = distribute_tensor(offs_full, mesh, [Replicate()])
        # a full-size Replicate operand is cut to the ragged layout by the sizes (upstream would cut even chunks)
        torch.testing.assert_close((x * rep).full_tensor(), full[0] * full[0])
        bare = DTensor.from_local(x.to_local(), mesh, x.placements, run_check=False, shape=x.shape, stride=x.stride())
        with pytest.raises(RaggedPlacementError, match="carries no sizes"):
            bare * rep  # ... but only with them
        # unaligned tokens: the experts' rows are on other ranks
        with pytest.raises(RaggedPlacementError, match="dispatch unaligned tokens first"):
            torch._grouped_mm(x, w1, offs)
        y = x.redistribute(mesh, [RaggedShard(0, 4, aligned=True)])
        with pytest.raises(RaggedPlacementError, match="offs must be a Replicate DTensor"):
            torch._grouped_mm(y, w1, offs.redistribute(mesh, [Shard(0)]))
        # two ragged layouts in one op
        with pytest.raises(RaggedPlacementError, match="different layouts"):
            x + y
        assert isinstance(x * 2.0, DTensor)  # a scalar is fine

"""Per-op ragged rules between router and combine (``ragged/sorting.py``, ``indexing.py``, ``counting.py``,
``views.py``) against plain torch on the full tensors: uneven token chunks (a rank with 0 tokens at ep=4),
an expert with no tokens, int64/int32 ids, float32/bf16 values, a 1-D ep mesh and ep x tp."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

import dtensor_rules
from dtensor_rules import ragged
from dtensor_rules._upstream import rank_tensors
from dtensor_rules._upstream.ragged import RaggedPlacementError
from dtensor_rules.kernels import moe_permute_indices
from dtensor_rules.ragged import RaggedShard
from dtensor_rules.testing import simulated_mesh

K, D = 2, 4
# (mesh shape, names, T, E): ep=2 uneven chunks (3, 2); ep=4 chunks (1, 1, 1, 0); ep x tp
MESHES = {"ep2": ((2,), None, 5, 4), "ep4": ((4,), None, 3, 8), "ep2xtp2": ((2, 2), ("ep", "tp"), 5, 4)}
DTYPES = [(torch.int64, torch.float32), (torch.int32, torch.bfloat16)]


@pytest.fixture(autouse=True)
def _installed():
    dtensor_rules.install()
    yield


def _data(T, E, id_dtype, dtype):
    g = torch.Generator().manual_seed(T * E)
    experts = [e for e in range(E) if e != 1]  # expert 1 gets no token
    ids = torch.tensor(experts)[torch.randint(0, len(experts), (T, K), generator=g)].to(id_dtype)
    return ids, torch.randn(T, D, generator=g).to(dtype), torch.randn(T * K, D, generator=g).to(dtype)


def _place(mesh, shard0):
    return [Shard(0) if shard0 else Replicate()] + [Replicate()] * (mesh.ndim - 1)


@pytest.mark.parametrize("id_dtype,dtype", DTYPES, ids=["i64-f32", "i32-bf16"])
@pytest.mark.parametrize("case", list(MESHES))
def test_sort_count_read_write_against_torch(case, id_dtype, dtype):
    shape, names, T, E = MESHES[case]
    ids, x, g = _data(T, E, id_dtype, dtype)
    flat = ids.reshape(-1)
    order_1 = flat.argsort(stable=True)
    with simulated_mesh(shape, names=names) as mesh:
        di = distribute_tensor(ids, mesh, _place(mesh, True))
        dx = distribute_tensor(x, mesh, _place(mesh, True)).requires_grad_()
        routed = ragged.route(di, E)
        values, order = torch.sort(routed, stable=True)
        torch.testing.assert_close(order.full_tensor(), order_1)
        torch.testing.assert_close(torch.argsort(routed, stable=True).full_tensor(), order_1)
        torch.testing.assert_close(values.full_tensor(), flat.sort(stable=True).values)
        for t in (routed, values):  # token order and layout order: Partial(sum) pieces of the global counts
            torch.testing.assert_close(t.bincount(minlength=E).full_tensor(), flat.long().bincount(minlength=E))
        torch.testing.assert_close(torch.histc(values.float(), E, 0, E).full_tensor(),
                                   torch.histc(flat.float(), E, 0, E))
        tok = order // K
        rows = dx.index_select(0, tok)
        torch.testing.assert_close(rows.full_tensor(), x[order_1 // K])
        torch.testing.assert_close(dx[tok].full_tensor(), x[order_1 // K])
        idx2 = tok.unsqueeze(1).expand(-1, D)
        torch.testing.assert_close(dx.gather(0, idx2).full_tensor(), x.gather(0, (order_1 // K).unsqueeze(1).expand(-1, D)))
        # backward of the read: new_zeros + index_add into Shard(0) tokens
        counts = ragged.context_of(rows).counts
        gd = ragged.distribute(distribute_tensor(g, mesh, _place(mesh, False)), mesh, counts, 0)
        (gx,) = torch.autograd.grad(rows, dx, gd)
        assert gx.placements[0] == Shard(0)
        torch.testing.assert_close(gx.full_tensor(), torch.zeros_like(x).index_add(0, order_1 // K, g))
        # writes into Shard(0) tokens, and their source gradients
        src = gd.detach().requires_grad_()
        out = rows.new_zeros((T, D)).index_add(0, tok, src)
        want = torch.zeros(T, D, dtype=dtype).index_add(0, order_1 // K, g)
        assert out.placements[0] == Shard(0)
        torch.testing.assert_close(out.full_tensor(), want)
        (gs,) = torch.autograd.grad(out, src, distribute_tensor(x, mesh, _place(mesh, True)))
        torch.testing.assert_close(gs.full_tensor(), x[order_1 // K])
        sa = rows.new_zeros((T, D)).scatter_add(0, idx2, src)
        torch.testing.assert_close(sa.full_tensor(), want)
        put = rows.new_zeros((T, D)).index_put((tok,), src, accumulate=True)
        torch.testing.assert_close(put.full_tensor(), want)


@pytest.mark.parametrize("case", list(MESHES))
def test_permute_unpermute_against_torch(case):
    shape, names, T, E = MESHES[case]
    ids, x, _ = _data(T, E, torch.int64, torch.float32)
    w = torch.rand(T, K)
    with simulated_mesh(shape, names=names) as mesh:
        dx, dw = (distribute_tensor(t, mesh, _place(mesh, True)).requires_grad_() for t in (x, w))
        rows, perm = ragged.permute(dx, distribute_tensor(ids, mesh, _place(mesh, True)), E)
        out = ragged.unpermute(rows * 2, perm, dw)
        out.backward(distribute_tensor(torch.ones(T, D), mesh, out.placements))
        one_x, one_w = x.clone().requires_grad_(), w.clone().requires_grad_()
        want = 2 * (one_w.unsqueeze(-1) * one_x.unsqueeze(1)).sum(1)
        want.sum().backward()
        torch.testing.assert_close(out.full_tensor(), want)
        torch.testing.assert_close(dx.grad.full_tensor(), one_x.grad)
        torch.testing.assert_close(dw.grad.full_tensor(), one_w.grad)


def test_refusals_name_the_fix():
    ids, x, _ = _data(5, 4, torch.int64, torch.float32)
    with simulated_mesh(2) as mesh:
        routed = ragged.route(distribute_tensor(ids, mesh, [Shard(0)]), 4)
        with pytest.raises(RaggedPlacementError, match="stable"):
            torch.sort(routed)
        with pytest.raises(RaggedPlacementError, match="stable"):
            torch.sort(routed, stable=True, descending=True)
        values, order = torch.sort(routed, stable=True)
        with pytest.raises(RaggedPlacementError, match="already in the ragged layout"):
            torch.sort(values, stable=True)
        with pytest.raises(RaggedPlacementError, match="sort them first"):
            routed.full_tensor()
        with pytest.raises(RaggedPlacementError, match="minlength"):
            values.bincount()
        with pytest.raises(ValueError, match="minlength"):
            values.bincount(minlength=2)
        with pytest.raises(RaggedPlacementError, match="earlier ranks"):
            order.cumsum(0)
        dx = distribute_tensor(x, mesh, [Shard(0)])
        with pytest.raises(IndexError, match="outside this rank"):
            dx.index_select(0, (order // K + 3) % 5)
        rows = dx.index_select(0, order // K)
        torch.testing.assert_close(rows.cumsum(1).full_tensor(), x[ids.reshape(-1).argsort(stable=True) // K].cumsum(1))


def test_moe_permute_indices_on_ragged_rows_is_refused_with_the_fix():
    # its input is per-rank received counts (local data): a ragged DTensor is a mix-up, refused with the fixes
    # named (the dispatch already groups rows per local expert); the named escape hatch gives the one-device result
    C, full = [[1, 0, 1, 0], [0, 1, 0, 1]], torch.tensor([3, 1, 0, 2])
    with simulated_mesh(2) as mesh:
        counts = distribute_tensor(torch.tensor(C), mesh, [Replicate()])
        x = ragged.distribute(distribute_tensor(full, mesh, [Replicate()]), mesh, counts, 0)
        for t in (x, x.redistribute(mesh, [RaggedShard(0, 4, aligned=True)])):
            with pytest.raises(RaggedPlacementError, match=r"received counts.*aligned=True.*full_tensor\(\)"):
                moe_permute_indices(t, 2, 2, 16, 4)
        got = moe_permute_indices(x.full_tensor(), 2, 2, 16, 4)
        for g, w in zip(got, moe_permute_indices(full, 2, 2, 16, 4)):
            torch.testing.assert_close(g, w)
        rows = x.redistribute(mesh, [RaggedShard(0, 4, aligned=True)])
        recv = ragged.context_of(rows).recv_counts  # what this rank received per (sender, local expert)
        for r, t in rank_tensors(recv).items():
            torch.testing.assert_close(t, torch.tensor(C)[:, 2 * r:2 * r + 2].reshape(-1))

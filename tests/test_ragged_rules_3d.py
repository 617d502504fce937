"""Per-op ragged rules on a 3-D simulated mesh (2, 2, 2), forward and backward, against plain torch.

The EP mesh dim is each of the three in turn; the other two carry the layouts of EP x TP x FSDP:
token rows ``Shard(1)`` (hidden split) or ``Replicate``, expert weights ``Shard(0)`` on ep plus an
FSDP2-style shard (``Shard(1)`` of every expert weight, or ``Shard(0)`` nested after ep) and a TP split.
Uneven token chunks, a rank with no tokens, an expert with no rows; int32/int64 ids, bool and int64
values where the op accepts them. Oracle: the same function on one device on the full tensors
(``full_tensor()`` of the result and of every gradient). The regression tests at the end pin the
defects this file found (each failed before its fix, on a 1-D or 2-D mesh where that suffices).
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

K, D = 2, 4
R = Replicate()
# name: (ep mesh dim, token placement on the two other mesh dims, T, E)
LAYOUTS = {
    "ep-middle, tp-hidden": (1, (R, Shard(1)), 5, 4),  # chunks 3/2
    "ep-first, one token": (0, (R, Shard(1)), 1, 4),  # chunks 1/0: a rank with no tokens
    "ep-last, hidden on dp": (2, (Shard(1), R), 3, 2),
}


@pytest.fixture(autouse=True)
def _installed():
    dtensor_rules.install()
    yield


def _routing(T: int, E: int, id_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(T * E)
    experts = torch.tensor([e for e in range(E) if e != 1])  # expert 1 gets no row
    ids = experts[torch.randint(0, len(experts), (T, K), generator=g)].to(id_dtype)
    return ids, torch.randn(T, D, generator=g)


def _placements(m: int, at_m, others) -> list:
    rest = iter(others)
    return [at_m if i == m else next(rest) for i in range(3)]


# functions of (tokens x (T, D), token index of each sorted assignment row tok (T*k,)): the block's reads and writes
def _select(x, tok):
    return x.index_select(0, tok)


def _index(x, tok):
    return x[tok] * 2


def _gather(x, tok):
    return x.gather(0, tok.unsqueeze(1).expand(-1, x.shape[1]))


def _index_add(x, tok):
    rows = x.index_select(0, tok)
    return rows.new_zeros(x.shape).index_add(0, tok, rows * 3)


def _scatter_add(x, tok):
    rows = x[tok]
    return rows.new_zeros(x.shape).scatter_add(0, tok.unsqueeze(1).expand(-1, x.shape[1]), rows.tanh())


def _index_put(x, tok):
    return x.new_zeros(x.shape).index_put((tok,), x.index_select(0, tok) * 0.5, accumulate=True)


def _cumsum(x, tok):
    return x.index_select(0, tok).cumsum(1)


def _views(x, tok):
    rows = x.index_select(0, tok)
    return (rows.view(rows.shape[0], 2, rows.shape[1] // 2).sigmoid() * 2).reshape(rows.shape[0], -1).flatten(1)


FUNCTIONS = [_select, _index, _gather, _index_add, _scatter_add, _index_put, _cumsum, _views]
# the first layout runs every function, the other two half each (suite time: 8 simulated ranks per op)
PER_LAYOUT = {name: FUNCTIONS if i == 0 else FUNCTIONS[i - 1::2] for i, name in enumerate(LAYOUTS)}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_reads_writes_views_forward_backward(layout):
    m, others, T, E = LAYOUTS[layout]
    ids, x = _routing(T, E, torch.int64 if m else torch.int32)
    flat = ids.reshape(-1).long()
    tok_1 = flat.argsort(stable=True) // K
    with simulated_mesh((2, 2, 2)) as mesh:
        routed = ragged.route(distribute_tensor(ids, mesh, _placements(m, Shard(0), (R, R))), E, m)
        values, order = torch.sort(routed, stable=True)
        torch.testing.assert_close(order.full_tensor(), flat.argsort(stable=True))
        torch.testing.assert_close(values.full_tensor().long(), flat.sort(stable=True).values)
        for t in (routed, values):
            counts = t.bincount(minlength=E)
            assert counts.placements[m] == Partial()
            torch.testing.assert_close(counts.full_tensor(), flat.bincount(minlength=E))
        torch.testing.assert_close(torch.histc(values.float(), E, 0, E).full_tensor(), torch.histc(flat.float(), E, 0, E))
        tok = order // K
        for fn in PER_LAYOUT[layout]:
            dx = distribute_tensor(x, mesh, _placements(m, Shard(0), others)).requires_grad_()
            one = x.clone().requires_grad_()
            got, want = fn(dx, tok), fn(one, tok_1)
            torch.testing.assert_close(got.full_tensor(), want, msg=lambda s: f"{fn.__name__}: {s}")
            # a loss over the ragged rows (or the tokens): its gradient is Replicate until a rule cuts it
            (got * got).sum().backward()
            (want * want).sum().backward()
            torch.testing.assert_close(dx.grad.full_tensor(), one.grad, msg=lambda s: f"{fn.__name__} grad: {s}")


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_integer_and_bool_values(layout):
    m, others, T, E = LAYOUTS[layout]
    ids, x = _routing(T, E, torch.int64)
    tok_1 = ids.reshape(-1).argsort(stable=True) // K
    xi, xb = (x * 10).long(), x > 0
    with simulated_mesh((2, 2, 2)) as mesh:
        _, order = torch.sort(ragged.route(distribute_tensor(ids, mesh, _placements(m, Shard(0), (R, R))), E, m),
                              stable=True)
        tok = order // K
        di, db = (distribute_tensor(t, mesh, _placements(m, Shard(0), others)) for t in (xi, xb))
        cases = [
            (di.index_select(0, tok), xi[tok_1]),
            (di[tok].cumsum(1), xi[tok_1].cumsum(1)),
            (di[tok].new_zeros(xi.shape).scatter_add(0, tok.unsqueeze(1).expand(-1, D), di[tok] + 1),
             torch.zeros_like(xi).index_add(0, tok_1, xi[tok_1] + 1)),
            (db[tok] & (di[tok] > 3), xb[tok_1] & (xi[tok_1] > 3)),
            (db.gather(0, tok.unsqueeze(1).expand(-1, D)), xb[tok_1]),
            (db[tok].new_zeros(xb.shape).index_put((tok,), db[tok]), torch.zeros_like(xb).index_put((tok_1,), xb[tok_1])),
            (torch.where(db[tok], di[tok], -1), torch.where(xb[tok_1], xi[tok_1], -1)),
        ]
        for i, (got, want) in enumerate(cases):
            assert got.dtype == want.dtype, i
            torch.testing.assert_close(got.full_tensor(), want, msg=lambda s: f"case {i}: {s}")


def _swiglu(x, w1, w3, w2, offs):
    a = torch._grouped_mm(x, w1, offs)
    h = F.silu(a) * torch._grouped_mm(x, w3, offs)
    return torch._grouped_mm(h, w2, offs).view(x.shape[0], 2, -1).flatten(1)


S = Shard
# name: (ep mesh dim, [w1, w3, w2 placements]); D=16, H=8, E=4
EXPERTS = {
    "dp-R, ep, tp": (1, [[R, S(0), S(2)], [R, S(0), S(2)], [R, S(0), S(1)]]),
    # FSDP2 on the outer mesh dim shards a dim tp leaves alone (w1/w3 dim 1, w2 dim 2): gathered per matmul (its
    # unshard); the expert gradients come back Replicate there (every fsdp rank holds these tokens)
    "fsdp, ep, tp": (1, [[S(1), S(0), S(2)], [S(1), S(0), S(2)], [S(2), S(0), S(1)]]),
    # FSDP2's default Shard(0) nested after ep (each ep rank's experts split again), then tp
    "ep, fsdp dim 0 nested, tp": (0, [[S(0), S(0), S(2)], [S(0), S(0), S(2)], [S(0), S(0), S(1)]]),
    # tp outermost, ep last; w2's output dim (free) on the fsdp dim
    "tp, fsdp free dim, ep": (2, [[S(2), S(1), S(0)], [S(2), S(1), S(0)], [S(1), S(2), S(0)]]),
}


@pytest.mark.parametrize("name", list(EXPERTS))
def test_expert_swiglu_ep_fsdp_tp(name):
    """Regression too: _grouped_mm refused experts sharded on a mesh dim the tokens are Replicate on (the FSDP
    cases), and the backward's silu_backward on a Partial-over-tp gradient was reduce-scattered onto the ragged
    rows (refused) in every case with tp."""
    m, places = EXPERTS[name]
    C = CASES[2]  # uneven partitions, an empty one
    E, rows, Dm, H = 4, sum(map(sum, C)), 16, 8
    torch.manual_seed(0)
    full = [torch.randn(rows, Dm), torch.randn(E, Dm, H) / 4, torch.randn(E, Dm, H) / 4, torch.randn(E, H, Dm) / 4]
    offs_1 = torch.tensor(C).sum(0).cumsum(0).to(torch.int32)
    g = torch.randn(rows, Dm)
    with simulated_mesh((2, 2, 2)) as mesh:
        rep = distribute_tensor(full[0], mesh, [R] * 3).requires_grad_()
        ws = [distribute_tensor(w, mesh, p).requires_grad_() for w, p in zip(full[1:], places)]
        counts = distribute_tensor(torch.tensor(C), mesh, [R] * 3)
        offs = distribute_tensor(offs_1, mesh, [R] * 3)
        x = ragged.distribute(rep, mesh, counts, m).redistribute(mesh, _placements(m, RaggedShard(0, E, True), (R, R)))
        out = _swiglu(x, *ws, offs)
        assert out.placements[m] == RaggedShard(0, E, aligned=True)
        back = out.redistribute(mesh, [RaggedShard(0, E, False) if i == m else p for i, p in enumerate(out.placements)])
        one = [t.clone().requires_grad_() for t in full]
        want = _swiglu(*one, offs_1)
        got = back.full_tensor()
        torch.testing.assert_close(got, want)
        (got * g).sum().backward()
        (want * g).sum().backward()
        for d, o in zip([rep, *ws], one):
            torch.testing.assert_close(d.grad.full_tensor(), o.grad)
        for w in ws:  # expert gradients stay sharded on ep
            assert w.grad.placements[m] == Shard(0)


# ---- regressions: one per defect found here (each failed before its fix) ----

def _rows_1d(mesh, C):
    full = torch.randn(sum(map(sum, C)), D)
    counts = distribute_tensor(torch.tensor(C), mesh, [R] * mesh.ndim)
    rep = distribute_tensor(full, mesh, [R] * mesh.ndim).requires_grad_()
    return full, rep, ragged.distribute(rep, mesh, counts, 0)


def test_regression_loss_over_ragged_rows_backward():
    # the gradient of rows.sum() is a Replicate tensor of the rows' size: it was refused by every op it met
    with simulated_mesh(2) as mesh:
        full, rep, x = _rows_1d(mesh, CASES[2])
        (x * x).sum().backward()
        torch.testing.assert_close(rep.grad.full_tensor(), 2 * full)


def test_regression_view_reshape_flatten():
    # view / reshape / flatten passed the global size to the local tensor: RuntimeError "shape ... is invalid"
    with simulated_mesh(2) as mesh:
        full, _, x = _rows_1d(mesh, CASES[2])
        v = x.view(-1, 2, 2)
        assert v.placements == (RaggedShard(0, 4, False),)
        torch.testing.assert_close(v.full_tensor(), full.view(-1, 2, 2))
        torch.testing.assert_close(v.flatten(1).full_tensor(), full)
        torch.testing.assert_close(x.reshape(x.shape[0], 4, 1).full_tensor(), full.reshape(-1, 4, 1))
        with pytest.raises(RuntimeError, match="not the ragged rows|flatten unevenly"):
            x.view(-1)  # merges the ragged rows with the hidden dim: upstream's view rule refuses


def test_regression_scatter_add_gather_with_tp_sharded_tokens():
    # scatter_add into tokens Shard(1) on tp with a Replicate (T*k, D) index ran the local op on mismatched
    # shapes (RuntimeError); gather from a Shard(1) source was refused
    T, E = 5, 4
    ids, x = _routing(T, E, torch.int64)
    tok_1 = ids.reshape(-1).argsort(stable=True) // K
    with simulated_mesh((2, 2)) as mesh:
        _, order = torch.sort(ragged.route(distribute_tensor(ids, mesh, [Shard(0), R]), E), stable=True)
        idx = (order // K).unsqueeze(1).expand(-1, D)
        dx = distribute_tensor(x, mesh, [Shard(0), Shard(1)])
        rows = dx.gather(0, idx)
        assert rows.placements == (RaggedShard(0, E, False), Shard(1))
        torch.testing.assert_close(rows.full_tensor(), x[tok_1])
        out = rows.new_zeros((T, D)).scatter_add(0, idx, rows)
        assert out.placements == (Shard(0), Shard(1))
        torch.testing.assert_close(out.full_tensor(), torch.zeros_like(x).index_add(0, tok_1, x[tok_1]))


def test_regression_row_op_along_tp_sharded_dim():
    # cumsum along a tp-sharded hidden dim needs an all-gather over tp: refused as a move of a ragged input
    with simulated_mesh((2, 2)) as mesh:
        full = torch.randn(sum(map(sum, CASES[2])), D)
        counts = distribute_tensor(torch.tensor(CASES[2]), mesh, [R, R])
        x = ragged.distribute(distribute_tensor(full, mesh, [R, Shard(1)]), mesh, counts, 0, placements=[R, Shard(1)])
        c = x.cumsum(1)
        assert c.placements[0] == RaggedShard(0, 4, False)
        torch.testing.assert_close(c.full_tensor(), full.cumsum(1))


def test_refused_layouts_name_the_fix():
    C = CASES[2]
    torch.manual_seed(0)
    with simulated_mesh((2, 2, 2)) as mesh:
        x = ragged.distribute(distribute_tensor(torch.randn(11, 16), mesh, [R] * 3), mesh,
                              distribute_tensor(torch.tensor(C), mesh, [R] * 3), 1)
        x = x.redistribute(mesh, [R, RaggedShard(0, 4, True), R])
        offs = distribute_tensor(torch.tensor(C).sum(0).cumsum(0).to(torch.int32), mesh, [R] * 3)
        # experts split on the outer dim first, then ep: ep rank r does not hold experts [r*E_l, (r+1)*E_l)
        w = distribute_tensor(torch.randn(4, 16, 8), mesh, [Shard(0), Shard(0), R])
        with pytest.raises(RaggedPlacementError, match="not a matmul layout"):
            torch._grouped_mm(x, w, offs)
        assert isinstance(torch._grouped_mm(x, distribute_tensor(torch.randn(4, 16, 8), mesh, [R, Shard(0), R]), offs),
                          DTensor)

"""The ops an MoE block runs between router and combine, on plain DTensors, forward and backward.

``sort`` / ``argsort`` (stable), ``bincount``, ``histc``, ``cumsum``, ``index_select``, ``index``,
``gather``, ``index_add``, ``scatter_add``, ``index_put`` (accumulate), views, and the expert
SwiGLU with ``_grouped_mm`` and group offsets, on a (2, 2, 2) simulated mesh: the tokens split on
each mesh dim in turn (uneven chunks, a rank with no token), the hidden dim split on another, an
expert no token picks, int32/int64 ids, float, int64 and bool values, the experts laid out as
EP x FSDP x TP (``Shard(0)`` on one mesh dim, an FSDP-style split and a hidden split on the
others). Oracle: the same function on one device on the full tensors (``full_tensor()`` of the
result and of every gradient).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

import dtensor_rules
from dtensor_rules.testing import simulated_mesh

K, D = 2, 4
R = Replicate()
# name: (mesh dim splitting the tokens, token placements on the two other mesh dims, T, E)
LAYOUTS = {
    "tokens on dim 1, hidden on dim 2": (1, (R, Shard(1)), 5, 4),  # chunks 3/2
    "tokens on dim 0, one token": (0, (R, Shard(1)), 1, 4),  # chunks 1/0: a rank with no tokens
    "tokens on dim 2, hidden on dim 0": (2, (Shard(1), R), 3, 2),
}


@pytest.fixture(autouse=True)
def _installed():
    dtensor_rules.install()
    yield


def _routing(T: int, E: int, id_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(T*k,) expert ids (slot-major, expert 1 never picked) and (T, D) tokens."""
    g = torch.Generator().manual_seed(T * E)
    experts = torch.tensor([e for e in range(E) if e != 1])
    ids = experts[torch.randint(0, len(experts), (T * K,), generator=g)].to(id_dtype)
    return ids, torch.randn(T, D, generator=g)


def _placements(m: int, at_m, others) -> list:
    rest = iter(others)
    return [at_m if i == m else next(rest) for i in range(3)]


# functions of (tokens x (T, D), token of each sorted assignment row tok (T*k,)): the block's reads and writes
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
def test_sort_count_read_write_forward_backward(layout):
    m, others, T, E = LAYOUTS[layout]
    flat, x = _routing(T, E, torch.int64 if m else torch.int32)
    order_1 = flat.long().argsort(stable=True)
    tok_1 = order_1 % T  # slot-major: assignment j*T + t is token t's
    with simulated_mesh((2, 2, 2)) as mesh:
        ids = distribute_tensor(flat, mesh, _placements(m, Shard(0), (R, R)))
        values, order = torch.sort(ids, stable=True)
        torch.testing.assert_close(order.full_tensor(), order_1)
        torch.testing.assert_close(values.full_tensor(), flat.sort(stable=True).values)
        torch.testing.assert_close(torch.argsort(ids, stable=True).full_tensor(), order_1)
        for t in (ids, values):
            counts = t.bincount(minlength=E)
            torch.testing.assert_close(counts.full_tensor(), flat.long().bincount(minlength=E))
            torch.testing.assert_close(counts.cumsum(0).full_tensor(), flat.long().bincount(minlength=E).cumsum(0))
        torch.testing.assert_close(torch.histc(values.float(), E, 0, E).full_tensor(), torch.histc(flat.float(), E, 0, E))
        tok = torch.remainder(order, T)
        for fn in PER_LAYOUT[layout]:
            dx = distribute_tensor(x, mesh, _placements(m, Shard(0), others)).requires_grad_()
            one = x.clone().requires_grad_()
            got, want = fn(dx, tok), fn(one, tok_1)
            torch.testing.assert_close(got.full_tensor(), want, msg=lambda s: f"{fn.__name__}: {s}")
            (got * got).sum().backward()
            (want * want).sum().backward()
            torch.testing.assert_close(dx.grad.full_tensor(), one.grad, msg=lambda s: f"{fn.__name__} grad: {s}")


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_integer_and_bool_values(layout):
    m, others, T, E = LAYOUTS[layout]
    flat, x = _routing(T, E, torch.int64)
    tok_1 = flat.argsort(stable=True) % T
    xi, xb = (x * 10).long(), x > 0
    with simulated_mesh((2, 2, 2)) as mesh:
        _, order = torch.sort(distribute_tensor(flat, mesh, _placements(m, Shard(0), (R, R))), stable=True)
        tok = torch.remainder(order, T)
        di, db = (distribute_tensor(t, mesh, _placements(m, Shard(0), others)) for t in (xi, xb))
        cases = [
            (di.index_select(0, tok), xi[tok_1]),
            (di[tok].cumsum(1), xi[tok_1].cumsum(1)),
            (di[tok].new_zeros(xi.shape).scatter_add(0, tok.unsqueeze(1).expand(-1, D), di[tok] + 1),
             torch.zeros_like(xi).index_add(0, tok_1, xi[tok_1] + 1)),
            (di.new_zeros(xi.shape).index_add(0, tok, di[tok]), torch.zeros_like(xi).index_add(0, tok_1, xi[tok_1])),
            (db[tok] & (di[tok] > 3), xb[tok_1] & (xi[tok_1] > 3)),
            (db.gather(0, tok.unsqueeze(1).expand(-1, D)), xb[tok_1]),
            (db[tok].new_zeros(xb.shape).index_put((tok,), db[tok]), torch.zeros_like(xb).index_put((tok_1,), xb[tok_1])),
            (torch.where(db[tok], di[tok], -1), torch.where(xb[tok_1], xi[tok_1], -1)),
        ]
        for i, (got, want) in enumerate(cases):
            assert got.dtype == want.dtype, i
            torch.testing.assert_close(got.full_tensor(), want, msg=lambda s: f"case {i}: {s}")


def _swiglu(x, w1, w3, w2, offs):
    h = F.silu(torch._grouped_mm(x, w1, offs=offs)) * torch._grouped_mm(x, w3, offs=offs)
    return torch._grouped_mm(h, w2, offs=offs)


S = Shard
# name: [w1, w3, w2 placements] on the (2, 2, 2) mesh; (E, D, H) = (4, 16, 8)
EXPERTS = {
    "replicated, ep, tp": [[R, S(0), S(2)], [R, S(0), S(2)], [R, S(0), S(1)]],
    "fsdp, ep, tp": [[S(1), S(0), S(2)], [S(1), S(0), S(2)], [S(2), S(0), S(1)]],
    "ep, fsdp nested on dim 0, tp": [[S(0), S(0), S(2)], [S(0), S(0), S(2)], [S(0), S(0), S(1)]],
    "tp, fsdp on a free dim, ep": [[S(2), S(1), S(0)], [S(2), S(1), S(0)], [S(1), S(2), S(0)]],
}


@pytest.mark.parametrize("name", list(EXPERTS))
def test_expert_swiglu_with_offsets_on_ep_fsdp_tp_layouts(name):
    """Grouped rows (uneven groups, an empty one) ``Replicate``, the experts as an EP x FSDP x TP layout:
    output, the rows' and every expert gradient equal one device."""
    counts = [5, 0, 2, 4]  # rows per expert
    E, rows, Dm, H = 4, sum(counts), 16, 8
    g = torch.Generator().manual_seed(0)
    full = [torch.randn(rows, Dm, generator=g), torch.randn(E, Dm, H, generator=g) / 4,
            torch.randn(E, Dm, H, generator=g) / 4, torch.randn(E, H, Dm, generator=g) / 4]
    offs_1 = torch.tensor(counts).cumsum(0).to(torch.int32)
    cot = torch.randn(rows, Dm, generator=g)
    with simulated_mesh((2, 2, 2)) as mesh:
        x = distribute_tensor(full[0], mesh, [R] * 3).requires_grad_()
        ws = [distribute_tensor(w, mesh, p).requires_grad_() for w, p in zip(full[1:], EXPERTS[name])]
        out = _swiglu(x, *ws, distribute_tensor(offs_1, mesh, [R] * 3))
        (out * distribute_tensor(cot, mesh, [R] * 3)).sum().backward()
        got = [out.full_tensor(), x.grad.full_tensor(), *(w.grad.full_tensor() for w in ws)]
    one = [t.clone().requires_grad_() for t in full]
    want = _swiglu(*one, offs_1)
    (want * cot).sum().backward()
    for n, a, b in zip(["output", "grad rows", "grad w1", "grad w3", "grad w2"], got, [want, *(t.grad for t in one)]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=lambda s: f"{n}: {s}")

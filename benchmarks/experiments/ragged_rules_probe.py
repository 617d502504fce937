"""Feasibility probe: can rules keep a ragged placement, and can the dispatch be a redistribute?

Design spike for issue 19 (docs/design/ragged_expert_placement.md); pokes torch privates on
purpose and reuses ``RaggedShard`` from ``ragged_placement_probe.py``. Simulated 2-rank mesh:

    PYTHONPATH=src python benchmarks/experiments/ragged_rules_probe.py

Shows the two plug points the design relies on:

1. a sharding strategy (here for a throwaway custom op) may put a ``RaggedShard`` in its
   output specs: DTensor's dispatch wraps the output with it unchanged;
2. upstream's executor skips a same-dim Shard -> Shard step (``_redistribute.py``: the
   ``shard_spec.dim != target_placement.dim`` test), so the dispatch/combine moves need the
   module-level ``redistribute_local_tensor`` wrapped (it is imported by name into
   ``_dispatch`` and ``_api`` too: three bindings). With the wrapper, ``x.redistribute``,
   an op's implicit input redistribution and autograd's backward all reach our transition.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

import torch
import torch.distributed._functional_collectives as funcol
from torch.distributed._local_tensor import rank_map
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor import _api, _dispatch, _redistribute
from torch.distributed.tensor._op_schema import OpSchema, OpSpec, OpStrategy
from torch.distributed.tensor._ops.utils import register_op_strategy

sys.path.insert(0, os.path.dirname(__file__))
import ragged_placement_probe as rp  # noqa: E402

from dtensor_rules.testing import simulated_mesh  # noqa: E402

COUNTS, D = rp.COUNTS, 3
LOG: list[str] = []

lib = torch.library.Library("epd_probe", "DEF")
lib.define("rowmm(Tensor x, Tensor w) -> Tensor")
lib.impl("rowmm", lambda x, w: x @ w, "CompositeExplicitAutograd")
lib.impl("rowmm", lambda x, w: x.new_empty(x.shape[0], w.shape[1]), "Meta")


@register_op_strategy(torch.ops.epd_probe.rowmm.default)
def _rowmm_strategy(op_schema: OpSchema) -> OpStrategy:
    """(P, Replicate) -> P for P in {Replicate, RaggedShard(0, aligned)}; an unaligned input must be
    dispatched first (the row asks for the aligned placement: DTensor's dispatch redistributes)."""
    x, w = op_schema.args_schema
    rows = []
    for spec in x.strategies:
        p = spec.output_spec.placements
        if all(q.is_replicate() or isinstance(q, rp.RaggedShard) for q in p):
            from torch.distributed.tensor._dtensor_spec import DTensorSpec
            p = tuple(rp.RaggedShard(q.dim, q.counts, True) if isinstance(q, rp.RaggedShard) else q for q in p)
            out = DTensorSpec(spec.output_spec.mesh, p, tensor_meta=spec.output_spec.tensor_meta)
            rep = DTensorSpec(spec.output_spec.mesh, (Replicate(),) * len(p))
            rows.append(OpSpec(out, input_specs=(out, rep), redistribute_cost=[[0.0], [0.0] * len(w.strategies)]))
    return OpStrategy(rows)


def _ragged_transition(local: torch.Tensor, src: rp.RaggedShard, dst: rp.RaggedShard, mesh) -> torch.Tensor:
    """unaligned <-> aligned on a 1-D mesh: one all_to_all with split sizes, then a local regroup."""
    LOG.append(f"transition {'aligned' if src.aligned else 'unaligned'} -> {'aligned' if dst.aligned else 'unaligned'}")
    counts = src.counts
    ep, E = len(counts), len(counts[0])
    E_l = E // ep
    # rows rank s sends to rank r: its rows of experts owned by r (unaligned -> aligned), or the reverse
    send = [[sum(counts[s][e] for e in range(r * E_l, (r + 1) * E_l)) for r in range(ep)] for s in range(ep)]
    if src.aligned:
        send = [list(col) for col in zip(*send)]
    recv = [list(col) for col in zip(*send)]
    order = rank_map(lambda r: torch.tensor(_regroup(counts, r, src.aligned), dtype=torch.long))
    if src.aligned:  # aligned local is expert-major: make it receiver-major before sending
        local = local.index_select(0, order)
    out = funcol.all_to_all_single(local, rank_map(lambda r: torch.tensor(recv[r])).tolist(),
                                   rank_map(lambda r: torch.tensor(send[r])).tolist(), (mesh, 0))
    out = funcol.wait_tensor(out)
    if not src.aligned:  # received sender-major: regroup expert-major
        out = out.index_select(0, order)
    return out


def _regroup(counts, rank: int, to_aligned_from_unaligned: bool) -> list[int]:
    """Permutation between sender-major (as an all_to_all delivers) and expert-major on the aligned rank."""
    ep, E = len(counts), len(counts[0])
    E_l = E // ep
    experts = range(rank * E_l, (rank + 1) * E_l)
    # sender-major position of (s, e, i)
    pos, p = {}, 0
    for s in range(ep):
        for e in experts:
            for i in range(counts[s][e]):
                pos[(s, e, i)] = p
                p += 1
    expert_major = [pos[(s, e, i)] for e in experts for s in range(ep) for i in range(counts[s][e])]
    if to_aligned_from_unaligned:
        return expert_major  # out[j] = received[expert_major[j]]
    inverse = [0] * len(expert_major)  # aligned (expert-major) -> sender-major for sending back
    for j, q in enumerate(expert_major):
        inverse[q] = j
    return inverse


@contextlib.contextmanager
def ragged_redistribute() -> Iterator[None]:
    """Wrap the three bindings of redistribute_local_tensor with the ragged transitions."""
    real = _redistribute.redistribute_local_tensor

    def wrapped(local, current_spec, target_spec, **kw):
        (a,), (b,) = current_spec.placements, target_spec.placements
        if isinstance(a, rp.RaggedShard) and isinstance(b, rp.RaggedShard) and a != b:
            return _ragged_transition(local, a, b, current_spec.mesh)
        return real(local, current_spec, target_spec, **kw)

    mods = (_redistribute, _dispatch, _api)
    for m in mods:
        m.redistribute_local_tensor = wrapped
    try:
        yield
    finally:
        for m in mods:
            m.redistribute_local_tensor = real


def main() -> None:
    n = sum(map(sum, COUNTS))
    full = torch.randn(n, D)
    w_full = torch.randn(D, 2)
    un, al = rp.RaggedShard(0, COUNTS, False), rp.RaggedShard(0, COUNTS, True)
    with simulated_mesh(2) as mesh, ragged_redistribute():
        def mk(p, requires_grad=False) -> DTensor:
            loc = rank_map(lambda r: full[torch.tensor(rp._rows_of(COUNTS, r, p.aligned), dtype=torch.long)])
            d = DTensor.from_local(loc, mesh, (p,), run_check=False, shape=full.shape, stride=full.stride())
            return d.requires_grad_() if requires_grad else d

        def want_local(p, t):
            return rank_map(lambda r: t[torch.tensor(rp._rows_of(COUNTS, r, p.aligned), dtype=torch.long)])

        def check(name, ok, note=""):
            print(f"{'OK' if ok else 'WRONG':5} {name} {note}| {'; '.join(LOG)}")
            LOG.clear()

        d = mk(un).redistribute(mesh, (al,))
        check("x.redistribute(unaligned -> aligned) = the dispatch (all_to_all with sizes)",
              d.placements == (al,) and torch.equal(d.to_local(), want_local(al, full)))
        back = d.redistribute(mesh, (un,))
        check("aligned -> unaligned = the combine", torch.equal(back.to_local(), want_local(un, full)))

        w = distribute_tensor(w_full, mesh, (Replicate(),))
        y = torch.ops.epd_probe.rowmm(mk(al), w)
        check("a rule emitting RaggedShard(aligned): rowmm(aligned, R) keeps it",
              y.placements == (al,) and torch.allclose(y.full_tensor(), full @ w_full), f"placements={y.placements} ")

        y = torch.ops.epd_probe.rowmm(mk(un), w)
        check("implicit dispatch: rowmm(unaligned, R) -> the op's dispatcher redistributes to aligned",
              y.placements == (al,) and torch.allclose(y.full_tensor(), full @ w_full), f"placements={y.placements} ")

        x = mk(un, requires_grad=True)
        y = x.redistribute(mesh, (al,))  # dispatch as a redistribute, differentiable
        c_full = torch.randn(n, D)
        c = distribute_tensor(c_full, mesh, (Replicate(),))
        (y.redistribute(mesh, (Replicate(),)) * c).sum().backward()
        g = x.grad
        check("backward through the dispatch (Redistribute.backward runs the combine)",
              g is not None and g.placements == (un,) and torch.equal(g.full_tensor(), c_full),
              f"grad placements={None if g is None else g.placements} ")

if __name__ == "__main__":
    print("torch", torch.__version__)
    main()

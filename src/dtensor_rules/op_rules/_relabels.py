"""Rows that relabel a replicated value as a partial one (what solvers are not offered: op_rules._solver_rows).

A row is given as ``(outs, ins)``: one layout (a placement per mesh dim, or ``None`` for an
output the op does not return) per output and per tensor input. On mesh dim ``m`` it is

- a **relabel** when an output is ``Partial`` there and every input is ``Replicate`` there: the
  row only names a replicated value partial (the all-Replicate row and a ``Replicate ->
  Partial`` move say the same);
- a **fused relabel** when its outputs are ``Partial(op)`` there (op in :data:`RELABEL_OPS`,
  whose partial of a replicated value is that value), an input is ``Replicate`` there, and the
  same row with that input ``Partial(op)`` there (or every such input: the *lift*) is among the
  rows offered: the row is that one after a free relabel of the input.

:func:`relabel_rows` finds both and, for a fused relabel, its maximal lift (every liftable
``Replicate`` input lifted, on every mesh dim): the row to offer in its place.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch.distributed.tensor.placement_types import Partial, Replicate

__all__ = ["RELABEL_OPS", "RowLayouts", "relabel_rows"]

# reduce ops whose Partial of a replicated value is that value: Replicate -> Partial(op) is a relabel
RELABEL_OPS = ("avg", "max", "min")

Layout = tuple[Any, ...]
RowLayouts = tuple[tuple[Layout | None, ...], tuple[Layout, ...]]  # (outs, ins)


def _pkey(p: Any) -> tuple:
    """A cheap hashable stand-in for a placement (``Placement.__eq__`` is slow on torch 2.13)."""
    t = type(p)
    if t is Replicate:
        return ("R",)
    if t is Partial:
        return ("P", p.reduce_op)
    return (t.__name__, repr(p))


def _key(row: RowLayouts) -> tuple:
    outs, ins = row
    return (tuple(None if o is None else tuple(map(_pkey, o)) for o in outs), tuple(tuple(map(_pkey, i)) for i in ins))


def _inputs_read_as_partial(row: RowLayouts, inputs: Sequence[int], m: int, q: Partial) -> RowLayouts:
    """``row`` with the inputs numbered ``inputs`` read as ``q`` on mesh dim ``m`` (they were Replicate there)."""
    outs, ins = row
    return outs, tuple(tuple(q if (k in inputs and d == m) else p for d, p in enumerate(lay)) for k, lay in enumerate(ins))


def relabel_rows(rows: Sequence[RowLayouts]) -> dict[int, RowLayouts | None]:
    """Index of every relabel or fused relabel in ``rows`` -> the row to offer instead (its
    maximal lift, which is in ``rows``), or None (a relabel: the all-Replicate row covers it)."""
    present = {_key(r) for r in rows}
    found: dict[int, RowLayouts | None] = {}
    for idx, row in enumerate(rows):
        outs, ins = row
        if not ins:
            continue
        ndim = len(ins[0])
        lifted = row
        pure = False
        for m in range(ndim):
            outs_m = [o[m] for o in outs if o is not None]
            partial_ops = {p.reduce_op for p in outs_m if isinstance(p, Partial)}
            if not partial_ops:
                continue
            if all(type(i[m]) is Replicate for i in ins):
                pure = True
                break
            if len(partial_ops) != 1 or (op := next(iter(partial_ops))) not in RELABEL_OPS:
                continue
            lifted = _maximal_lift(lifted, m, Partial(op), present)
        if pure:
            found[idx] = None
        elif lifted is not row:
            found[idx] = lifted
    return found


def _maximal_lift(row: RowLayouts, m: int, q: Partial, present: set[tuple]) -> RowLayouts:
    """``row`` with Replicate inputs on mesh dim ``m`` lifted to ``q`` one at a time while the
    lifted row is offered, then all the rest at once if that row is offered; ``row`` itself when
    no lift is offered."""
    current = row
    while True:
        replicated = [k for k, lay in enumerate(current[1]) if type(lay[m]) is Replicate]
        step = next((c for k in replicated if _key(c := _inputs_read_as_partial(current, (k,), m, q)) in present), None)
        if step is None:
            break
        current = step
    replicated = [k for k, lay in enumerate(current[1]) if type(lay[m]) is Replicate]
    if len(replicated) > 1 and _key(every := _inputs_read_as_partial(current, replicated, m, q)) in present:
        current = every
    return current

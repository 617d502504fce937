"""Which rows a solver's query gets: the ones it can use, not the dominated ones, and none that relabels.

A solver (AutoParallel, ``dtensor_rules.solver``) prices every row a rule offers: each row is
ILP variables per input candidate. Not offered to a solver's query (several candidate specs per
input), and why:

==========================================  ====================================================
row (on one mesh dim)                       why not offered
==========================================  ====================================================
asks input ``i`` for ``Partial(avg|max|     never cheaper than the same row with ``Replicate``
min)`` where no candidate of ``i``          there: reaching the Partial is a move from a layout
carries that reduce op                      the producer does not have, and the Partial output
                                            needs a reduction ``Replicate`` does not
a **relabel**: a ``Partial`` output with    it only relabels a replicated value as a partial
every input ``Replicate``                   one; the all-Replicate row and a ``Replicate ->
                                            Partial`` move say the same, and the move is where a
                                            solver must price it
a **fused relabel**: a ``Partial(op)``      the same row with that input ``Partial(op)`` is
output (op avg|max|min) with a              offered: this one is it after a free ``Replicate ->
``Replicate`` input, where the row with     Partial(op)`` of the input (the mean, max, min of a
that input ``Partial(op)`` (one input,      replicated value is itself). E.g. ``index_put``'s
or all of them) is offered too              ``(P(avg) self, R idx, R values) -> P(avg)`` next to
                                            ``(P(avg), R, P(avg))``, ``cat``'s one-part-partial
                                            rows next to the all-partial one
==========================================  ====================================================

Why relabels are not offered: a solver that prices ``Replicate -> Partial`` as impossible (as
AutoParallel does) but a switch of Partial kind (``avg -> sum``) as free can route a
``Partial(sum)`` value through such a row disguised as ``Partial(avg)`` next to a replicated
operand, which is valid for avg and not for sum (docs/solver.md, "AutoParallel's free partial
switch"). Without them a partial output only comes from partial inputs of the same kind (or a
rule's own reduction, e.g. ``Shard`` operands of a matmul to ``Partial(sum)``).

``Partial(sum)`` rows stay: linearity rows such as ``_grouped_mm``'s ``(P(sum), R, R) -> P(sum)``
let a solver keep a gradient partial across an op and reduce once, which upstream's rules offer too.

Dispatch queries (one spec per input) never reach this filter: an eager call holds one layout,
so a relabelling row there moves nothing and cannot be chosen for a move it does not make. The
full enumeration (every row, as before) is one switch away: :func:`full_enumeration` (``with
full_enumeration():`` or ``set_full_enumeration(True)``), or ``DTENSOR_RULES_SOLVER_ROWS=full`` in
the environment; the validator queries under it, so what it proves is every row.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from typing import Any

from torch.distributed.tensor.placement_types import Partial

from dtensor_rules.op_rules._relabels import RELABEL_OPS, RowLayouts, relabel_rows

__all__ = ["DOMINATED_UNLESS_CARRIED", "RELABEL_OPS", "carried_reduce_ops", "full_enumeration", "is_full_enumeration",
           "is_solver_query", "relabel_rows", "set_full_enumeration", "trim_rows", "trim_strategy"]

DOMINATED_UNLESS_CARRIED = ("avg", "max", "min")
_state = {"full": os.environ.get("DTENSOR_RULES_SOLVER_ROWS", "").strip().lower() == "full"}


def is_full_enumeration() -> bool:
    """True when solver queries get every row (the switch is on)."""
    return _state["full"]


def set_full_enumeration(on: bool) -> bool:
    """Turn the full enumeration for solver queries on or off; returns the previous setting."""
    # nothing to clear: the switch changes only solver queries, which call the strategy functions
    # directly; dispatch's sharding caches never hold a solver query's answer
    previous, _state["full"] = _state["full"], bool(on)
    return previous


@contextlib.contextmanager
def full_enumeration(on: bool = True) -> Iterator[None]:
    """Inside: solver queries get every row (``on=False``: the trimmed set)."""
    previous = set_full_enumeration(on)
    try:
        yield
    finally:
        set_full_enumeration(previous)


def is_solver_query(strategies: Sequence[Any]) -> bool:
    """A solver's query: some input holds several candidate specs."""
    return any(len(s.strategies) != 1 for s in strategies)


def carried_reduce_ops(strategies: Sequence[Any]) -> list[frozenset[str]]:
    """Per input: the reduce ops of the Partial placements any of its candidate specs carries."""
    return [
        frozenset(p.reduce_op for spec in s.strategies for p in spec.output_spec.placements if isinstance(p, Partial))
        for s in strategies
    ]


def trim_rows(rows: Sequence[Sequence[Any]], strategies: Sequence[Any], n_out: int) -> list[Sequence[Any]]:
    """``rows`` (single-dim: outputs then inputs) without those asking an input for a
    Partial(avg|max|min) none of its candidates carries, and without relabels (module table); a
    fused relabel is replaced by its lift (kept even where no candidate carries that Partial yet:
    a ``Replicate -> Partial(op)`` move reaches it, priced by the solver). All of them for a
    dispatch query (one spec per input) and under the full enumeration."""
    if is_full_enumeration() or not is_solver_query(strategies):
        return list(rows)
    carried = carried_reduce_ops(strategies)

    def useful(row: Sequence[Any]) -> bool:
        for p, ops in zip(row[n_out:], carried):
            if isinstance(p, Partial) and p.reduce_op in DOMINATED_UNLESS_CARRIED and p.reduce_op not in ops:
                return False
        return True

    as_layouts = [_single_dim_layouts(r, n_out) for r in rows]
    relabels = relabel_rows(as_layouts)
    lifts = {_lkey(lift) for lift in relabels.values() if lift is not None}
    return [r for i, (r, lay) in enumerate(zip(rows, as_layouts))
            if i not in relabels and (useful(r) or _lkey(lay) in lifts)]


def _single_dim_layouts(row: Sequence[Any], n_out: int) -> RowLayouts:
    return (tuple(None if p is None else (p,) for p in row[:n_out]), tuple((p,) for p in row[n_out:]))


def _lkey(row: RowLayouts) -> tuple:
    return tuple(None if lay is None else tuple(repr(p) for p in lay) for part in row for lay in part)


def carried_per_mesh_dim(strategies: Sequence[Any]) -> list[list[frozenset[str]]]:
    """Per input, per mesh dim: the reduce ops of the Partials its candidate specs carry there."""
    out = []
    for s in strategies:
        ndim = len(s.strategies[0].output_spec.placements)
        out.append([
            frozenset(spec.output_spec.placements[m].reduce_op for spec in s.strategies
                      if isinstance(spec.output_spec.placements[m], Partial))
            for m in range(ndim)
        ])
    return out


def trim_strategy(strategy: Any, strategies: Sequence[Any]) -> Any:
    """``strategy`` (an expanded ``OpStrategy``) without the specs that ask an input for a
    Partial(avg|max|min) on a mesh dim where none of its candidates carries that reduce op
    there, nor relabels (module table); unchanged for dispatch queries and under the full
    enumeration."""
    if is_full_enumeration() or not is_solver_query(strategies):
        return strategy
    carried = carried_per_mesh_dim(strategies)

    def useful(spec: Any) -> bool:
        for in_spec, per_dim in zip(spec.input_specs or (), carried):
            for p, ops in zip(in_spec.placements, per_dim):
                if isinstance(p, Partial) and p.reduce_op in DOMINATED_UNLESS_CARRIED and p.reduce_op not in ops:
                    return False
        return True

    kept = [s for s in strategy.strategies if useful(s)]
    relabels = relabel_rows([_spec_layouts(s) for s in kept])
    kept = [s for i, s in enumerate(kept) if i not in relabels]
    if kept and len(kept) != len(strategy.strategies):
        strategy.strategies = kept
    return strategy


def _spec_layouts(spec: Any) -> RowLayouts:
    outs = spec.output_specs
    outs = (outs,) if not isinstance(outs, (tuple, list)) else outs
    return (tuple(None if o is None else tuple(o.placements) for o in outs),
            tuple(tuple(i.placements) for i in spec.input_specs or ()))

"""Which rows a solver's query gets: the ones it can use, not the dominated ones.

A solver (AutoParallel, ``dtensor_rules.solver``) prices every row a rule offers: each row is
ILP variables per input candidate. Two kinds of rows are dominated. (1) A row that asks input ``i`` for ``Partial(avg|max|min)``
when no candidate layout of input ``i`` carries that reduce op is never cheaper than the same
row with ``Replicate`` there: reaching the Partial costs a move from a layout the producer does
not have, and the Partial output then needs a reduction that ``Replicate`` does not. Those rows
are dropped from solver queries (several candidate specs per input). (2) A row mixing
``Replicate`` and ``Partial(avg|max|min)`` inputs (``cat``'s one-part-partial rows) when the row
with all those inputs ``Partial`` is offered: ``Replicate -> Partial(avg|max|min)`` is free. ``Partial(sum)`` rows are
kept: linearity rows such as ``_grouped_mm``'s ``(P(sum), R, R) -> P(sum)`` let a solver keep a
gradient partial across an op and reduce once, which upstream's rules offer too.

Dispatch queries (one spec per input) never reach this filter. The full enumeration (every
row, as before) is one switch away: :func:`full_enumeration` (``with full_enumeration():`` or
``set_full_enumeration(True)``), or ``DTENSOR_RULES_SOLVER_ROWS=full`` in the environment.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from typing import Any

from torch.distributed.tensor.placement_types import Partial, Replicate

__all__ = ["DOMINATED_UNLESS_CARRIED", "carried_reduce_ops", "full_enumeration", "is_full_enumeration",
           "is_solver_query", "set_full_enumeration", "trim_rows"]

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
    Partial(avg|max|min) none of its candidates carries, nor those :func:`_dominated_mixed`; all of
    them for a dispatch query (one spec per input) and under the full enumeration."""
    if is_full_enumeration() or not is_solver_query(strategies):
        return list(rows)
    carried = carried_reduce_ops(strategies)

    def useful(row: Sequence[Any]) -> bool:
        for p, ops in zip(row[n_out:], carried):
            if isinstance(p, Partial) and p.reduce_op in DOMINATED_UNLESS_CARRIED and p.reduce_op not in ops:
                return False
        return True

    kept = [r for r in rows if useful(r)]
    present = {_key(r) for r in kept}
    return [r for r in kept if not _dominated_mixed(r, n_out, present)]


def _key(row: Sequence[Any]) -> tuple:
    return tuple(repr(p) for p in row)


def _dominated_mixed(row: Sequence[Any], n_out: int, present: set[tuple]) -> bool:
    """A row mixing Replicate and Partial(op) inputs (op avg|max|min) when the same row with every
    Replicate input Partial(op) is offered too: Replicate -> Partial(op) is free (each rank already
    holds the value), so that row is never dearer; same output, same local shapes."""
    ops = {p.reduce_op for p in row[n_out:] if isinstance(p, Partial) and p.reduce_op in DOMINATED_UNLESS_CARRIED}
    if len(ops) != 1 or not any(isinstance(p, Replicate) for p in row[n_out:]):
        return False
    q = Partial(ops.pop())
    lifted = [*row[:n_out], *(q if isinstance(p, Replicate) else p for p in row[n_out:])]
    return _key(lifted) in present


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
    there; unchanged for dispatch queries and under the full enumeration."""
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
    if kept and len(kept) != len(strategy.strategies):
        strategy.strategies = kept
    return strategy

"""Per-rank generators: an explicit ``torch.Generator`` behaves on a simulated mesh as on real ranks.

On real ranks every process has its own generator object: ``torch.Generator().manual_seed(s)``
then ``torch.randn(..., generator=g)`` gives every rank the SAME values. ``LocalTensorMode`` runs
the op once per simulated rank with the one shared generator object, so rank 1 continues
rank 0's stream and draws other values: data made inside the simulated mesh differs per rank,
and a training loop drawing its batch there silently diverges from one device (it keeps a
per-rank state only for the DEFAULT generator). With this patch each simulated rank has its own
state of every explicit generator, starting from the generator's state when it was first used
(or last reseeded) — one generator object per rank, as on real ranks. After each op the object is
left at rank 0's state, so code outside the mode continues rank 0's stream.

Reseeding is seen by the state: when a generator's state is not the one the last op left it in
(``manual_seed``, ``set_state``, a draw outside the mode), every rank restarts from it.

This fixes the simulator, not torch: :func:`per_rank_generators` wraps ``LocalTensorMode``'s
per-rank loop only while a :func:`dtensor_rules.testing.simulated_mesh` block is open (the
outermost one wraps, its exit restores torch's own functions), so ``import dtensor_rules`` leaves
the loop as torch made it. A bare ``LocalTensorMode`` keeps upstream's shared-generator behaviour.
"""

from __future__ import annotations

import contextlib
import contextvars
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils import _pytree as pytree

from dtensor_rules._upstream import per_rank_run_hooks
__all__ = ["GeneratorStates", "per_rank_generators", "UPSTREAM_GAP"]

# what this stands in for (tests/test_upstream_gaps.py runs the reproducer on torch alone)
UPSTREAM_GAP = ("defect: LocalTensorMode runs every simulated rank's draw from the one shared explicit "
                "torch.Generator, so rank 1 continues rank 0's stream (real ranks each draw the same values) "
                "(checked: torch 2.13.0, 2.14.1)")


class GeneratorStates:
    """One generator's per-rank states, and the state the last simulated op left the object in."""

    def __init__(self, start: torch.Tensor) -> None:
        self.per_rank: dict[int, torch.Tensor] = {}
        self.start = start  # what a rank not seen yet starts from
        self.left: torch.Tensor | None = None

    def state_for(self, rank: int) -> torch.Tensor:
        return self.per_rank.get(rank, self.start)


_STATES: "weakref.WeakKeyDictionary[torch.Generator, GeneratorStates]" = weakref.WeakKeyDictionary()
# during one per-rank loop: generator -> the rank whose call it was last handed to
_CURRENT: contextvars.ContextVar[dict[torch.Generator, int] | None] = contextvars.ContextVar("_CURRENT", default=None)


def _states_of(g: torch.Generator) -> GeneratorStates:
    now = g.get_state()
    states = _STATES.get(g)
    if states is None or states.left is None or not torch.equal(now, states.left):
        states = GeneratorStates(now)  # first use, or reseeded since the last op: every rank restarts here
        _STATES[g] = states
    return states


def _make_run(original: Callable[..., Any]) -> Callable[..., Any]:
    def run(func: Any, ranks: Any, args: Any, kwargs: Any, **options: Any) -> Any:
        gens = [a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Generator)]
        if not gens:
            return original(func, ranks, args, kwargs, **options)
        for g in gens:
            _states_of(g)
        current: dict[torch.Generator, int] = {}
        token = _CURRENT.set(current)
        try:
            result = original(func, ranks, args, kwargs, **options)
        finally:
            _CURRENT.reset(token)
            for g, rank in current.items():  # the last rank's call has run: keep where it left g
                states = _STATES[g]
                states.per_rank[rank] = g.get_state()
                first = states.state_for(min(ranks))
                g.set_state(first)
                states.left = first
        return result

    return run


def _make_map(original: Callable[..., Any]) -> Callable[..., Any]:
    def map_to_rank(value: Any, rank: int) -> Any:
        current = _CURRENT.get()
        if current is None or not isinstance(value, torch.Generator):
            return original(value, rank)
        states = _STATES[value]
        previous = current.get(value)
        if previous is not None and previous != rank:
            states.per_rank[previous] = value.get_state()  # the previous rank's call has run
        if previous != rank:
            value.set_state(states.state_for(rank))
            current[value] = rank
        return original(value, rank)

    return map_to_rank


@contextlib.contextmanager
def per_rank_generators() -> Iterator[None]:
    """Inside the block ``LocalTensorMode`` gives every simulated rank its own state of each explicit
    generator; the outermost block wraps the per-rank loop and its exit puts torch's functions back."""
    if per_rank_run_hooks.wrapped():  # an enclosing block owns the wrap
        yield
        return
    per_rank_run_hooks.wrap(_make_run, _make_map)
    try:
        yield
    finally:
        per_rank_run_hooks.unwrap()

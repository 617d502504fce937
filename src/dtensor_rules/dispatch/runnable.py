"""Which input moves DTensor's dispatch runs, and the error when an ``out=`` / in-place call leaves none.

Dispatch redistributes an input on each mesh dim from Replicate to anything, from Shard to
Replicate or another Shard, and from Partial to Replicate or Shard. It does not run Shard ->
Partial (torch 2.13 raises "not supported yet"; 2.14 only Shard -> Partial("sum"), by
materialising a full-size local tensor) nor one Partial kind -> another, and DTensor's
``redistribute_cost`` prices all of these infinite. The compact greedy never picks them
(:func:`~dtensor_rules.dispatch.greedy.transition_weight`); when an input written into (an
``out=`` tensor, an in-place ``self``) leaves no other strategy, the fallback expansion keeps
only the strategies dispatch runs (:func:`runnable_only`), and none left is the clear error of
:func:`out_layout_error` instead of DTensor's failure in the middle of redistributing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dtensor_rules._upstream import SHARD_TO_PARTIAL_SUM_RUNS, DTensorSpec, OpStrategy
from dtensor_rules.dispatch.greedy import Key, key


def runnable(src: Sequence[Key], dst: Sequence[Key]) -> bool:
    """Whether dispatch can move a tensor from placement keys ``src`` to ``dst`` (one per mesh dim)."""
    for s, d in zip(src, dst):
        if s == d or d[0] not in ("P", "PM") or s[0] == "R":
            continue
        if s[0] == "S" and d == ("P", "sum") and SHARD_TO_PARTIAL_SUM_RUNS:
            continue
        return False
    return True


def runnable_only(strategy: OpStrategy, current: Sequence[DTensorSpec]) -> OpStrategy:
    """The strategies of ``strategy`` whose every input dispatch can move there from ``current``."""
    have = [tuple(map(key, c.placements)) for c in current]
    return OpStrategy([
        s for s in strategy.strategies
        if s.input_specs is None
        or all(runnable(h, tuple(map(key, t.placements))) for h, t in zip(have, s.input_specs))
    ])


def out_layout_error(op: Any, current: Sequence[DTensorSpec], fixed: Mapping[int, int]) -> RuntimeError:
    """No strategy writes the tensors in ``fixed`` (input index -> output index) as they are laid
    out, from these inputs, with moves dispatch runs. Keeps upstream's phrase for a result that
    cannot be written in place (the validator recognises it) and names the fix."""
    written = ", ".join(str(tuple(current[i].placements)) for i in fixed)
    inputs = ", ".join(str(tuple(c.placements)) for i, c in enumerate(current) if i not in fixed)
    cannot = "Shard to a Partial other than Partial(sum)" if SHARD_TO_PARTIAL_SUM_RUNS else "Shard to Partial"
    return RuntimeError(
        f"{op}: in-place operations that require placement changes are not supported: no strategy of its rule "
        f"writes an output laid out like the out= / in-place DTensor ({written}) from inputs laid out as "
        f"[{inputs}] with moves DTensor runs (it does not redistribute {cannot}, nor one Partial kind to "
        "another). Pass an out= DTensor laid out as the result can be (e.g. Replicate), redistribute the "
        "inputs first, or call the functional op and redistribute its result"
    )


__all__ = ["out_layout_error", "runnable", "runnable_only"]

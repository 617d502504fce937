"""Upstream's strategy pricing under symbolic shapes, on the sizes' hints (the ``hinted_strategy_costs`` patch).

Why: upstream's single-dim strategy expansion (``expand_to_full_mesh_op_strategy``) prices every
full-mesh candidate against every input strategy with ``redistribute_cost``, ~60 calls per op on
a 2-D mesh. Under ``torch.compile(dynamic=True)`` the specs' sizes are SymInts, so each call does
its byte arithmetic in sympy: ``mm`` took 0.75 s of sharding propagation per call, and
propagation was a third of the MoE block's compile (docs/compile.md, "Compile time").

What changes: only the name ``torch.distributed.tensor._ops.utils.redistribute_cost`` (the one
the expansion calls). A spec whose shape or stride holds a SymInt is priced as the same spec with
each size replaced by its hint (``optimization_hint``: the example value of a backed size, the
fallback below for an unbacked one); a concrete spec goes to upstream unchanged. Repeated pairs of
priced specs are memoized (the expansion asks for the same input against the same candidate many
times).

Why that is valid: the cost only chooses among strategies that are all correct for every size;
the chosen one runs with the symbolic sizes as before. The symbolic prices were compared with
``guard_or_false``, which on a backed size evaluates the hint anyway (and records a guard, so a
token count on the other side of a cost tie recompiled); on hints no guard is recorded. An unbacked
size has no hint: ``guard_or_false`` made every comparison with it False, the fallback makes it a
large ordinary size.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._ops import utils as _ops_utils
from torch.fx.experimental.symbolic_shapes import optimization_hint

__all__ = ["UNBACKED_FALLBACK", "hinted_spec", "price_on_hints", "price_symbolically"]

# An unbacked size (a data-dependent token count) has no example value; inductor's default
# ``unbacked_symint_fallback`` is the same number.
UNBACKED_FALLBACK = 8192
_MEMO_LIMIT = 1 << 14

_saved: list[Callable[[DTensorSpec, DTensorSpec], float]] = []
# per ShapeEnv: raw sympy expression -> its hint (optimization_hint of an unbacked expression
# runs sympy's factor(); the same few sizes come back for every candidate)
_hints: weakref.WeakKeyDictionary[Any, dict[Any, int]] = weakref.WeakKeyDictionary()
_memo: dict[tuple[DTensorSpec, DTensorSpec], float] = {}


def _hint(d: Any) -> int:
    if not isinstance(d, torch.SymInt):
        return d
    node = d.node
    if node._hint is not None:
        return node._hint
    per_env = _hints.setdefault(node.shape_env, {})
    h = per_env.get(node._expr)
    if h is None:
        h = per_env[node._expr] = optimization_hint(d, fallback=UNBACKED_FALLBACK)
    return h


def hinted_spec(spec: DTensorSpec) -> DTensorSpec:
    """``spec`` itself when its sizes are concrete, else a copy whose sizes are their hints."""
    meta = spec.tensor_meta
    if meta is None or not any(isinstance(d, torch.SymInt) for d in (*meta.shape, *meta.stride)):
        return spec
    out = copy.copy(spec)  # keeps placements, shard order and mesh; __setattr__ resets the hash
    out.tensor_meta = TensorMeta(torch.Size([_hint(d) for d in meta.shape]),
                                 tuple(_hint(d) for d in meta.stride), meta.dtype)
    return out


def _priced_on_hints(current: DTensorSpec, target: DTensorSpec) -> float:
    a, b = hinted_spec(current), hinted_spec(target)
    if a is current and b is target:
        return _saved[-1](current, target)
    key = (a, b)
    cost = _memo.get(key)
    if cost is None:
        if len(_memo) >= _MEMO_LIMIT:
            _memo.clear()
        cost = _memo[key] = _saved[-1](a, b)
    return cost


def price_on_hints() -> None:
    """Upstream's strategy expansion prices symbolic specs on their hints from now on."""
    _saved.append(_ops_utils.redistribute_cost)
    _ops_utils.redistribute_cost = _priced_on_hints


def price_symbolically() -> None:
    """Undo :func:`price_on_hints` exactly (upstream's own function back; the memo emptied)."""
    _ops_utils.redistribute_cost = _saved.pop()
    _memo.clear()
    _hints.clear()

"""Symbolic tracing (make_fx, AOTAutograd): one upstream defect that breaks compiled DTensor code.

The defect (torch 2.13 and 2.14, with or without our rules): ``proxy_tensor`` keeps
``tracer.sympy_expr_tracker``, a map from a bare sympy symbol to the proxy of the *last* SymInt
registered with that expression. DTensor's sharding propagation recomputes local sizes all the
time (``(2*s3) // 2`` is ``s3`` again), and every such value overwrites the entry with a lazy proxy
``floordiv(2*s3, 2)``. When a later SymInt with expression ``s3`` has no proxy of its own (a size
DTensor hands to the local op), the tracer builds it from the map; if the ``2*s3`` inside has no
proxy either, it is rebuilt from ``s3``, whose entry is ``floordiv(2*s3, 2)``: a cycle, and a
``RecursionError`` while AOTAutograd traces the joint graph. The MoE block of
:mod:`dtensor_rules.models` under ``torch.compile(dynamic=True)`` hits it in the backward of its
final ``reshape`` (``tests/test_moe_compile.py``).

The fix keeps the *first* record of each symbol, as ``set_proxy_slot`` already does for the
SymInts themselves ("first one wins": the graph input that introduced the symbol). Any record
is a correct proxy for the same value; the first one cannot depend on a later one, so no cycle.
Applied by a full :func:`dtensor_rules.install` as the patch ``first_symbol_record``, undone by
:func:`dtensor_rules.uninstall`; only tracers created while it is applied are affected.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.fx.experimental.proxy_tensor as _proxy_tensor

__all__ = ["FirstRecordDict", "keep_first_symbol_record", "restore_symbol_record"]

_saved: list[Callable[[Any], None]] = []  # upstream's tracker initializer while ours is in place


class FirstRecordDict(dict):
    """A dict whose existing keys are never overwritten (later records of a symbol are dropped)."""

    def __setitem__(self, key: Any, value: Any) -> None:
        if key not in self:
            super().__setitem__(key, value)


def _init_trackers_keeping_first(tracer: Any) -> None:
    _saved[-1](tracer)
    tracer.sympy_expr_tracker = FirstRecordDict(tracer.sympy_expr_tracker)


def keep_first_symbol_record() -> None:
    """Every tracer created from now on keeps the first proxy recorded for each symbol."""
    _saved.append(_proxy_tensor._init_proxy_trackers)
    _proxy_tensor._init_proxy_trackers = _init_trackers_keeping_first


def restore_symbol_record() -> None:
    """Undo :func:`keep_first_symbol_record` exactly (upstream's own initializer back)."""
    _proxy_tensor._init_proxy_trackers = _saved.pop()

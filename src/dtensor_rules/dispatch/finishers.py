"""Finishers: an op whose chosen strategy dispatch cannot run as is computes its result on the miss.

``finish(op_call, args, kwargs, op_info, sharding)`` gets the sharding DTensor's propagation
just chose for the call and returns the call's result, or None to let DTensor cache that
sharding and run it. A result is not a sharding, so DTensor caches nothing for a finished call
and every call like it misses again, while the op's other layouts are cached and stay on the
fast path (``gather`` with a masked index: ``op_rules/gather_mask.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dtensor_rules._upstream import CacheMissCall, cache_miss_wrapped, is_output_sharding
from dtensor_rules.dispatch.miss_handlers import MissHandler, on_miss

__all__ = ["finish_on_miss", "finishing"]

Finish = Callable[[Any, Any, Any, Any, Any], Any]


def finish_on_miss(op: Any, finish: Finish) -> None:
    """Have ``finish`` complete every sharding-cache miss of ``op`` (see the module doc)."""
    on_miss(op, _finishing_handler(finish))


def finishing() -> bool:
    """Whether the cache-miss hook, and so every finisher, is in effect (a full ``install()``)."""
    return cache_miss_wrapped()


def _finishing_handler(finish: Finish) -> MissHandler:
    def finish_after_propagation(call: CacheMissCall, original: Callable[..., Any]) -> Any:
        # a finished call is never cached by DTensor, so it misses every time: let propagation
        # look in its Python cache, or every such call would price every strategy again
        call.look_in_python_cache()
        sharding = call.run(original)
        if not is_output_sharding(sharding):
            return sharding
        done = finish(call.op_call, call.args, call.kwargs, call.op_info, sharding)
        return sharding if done is None else done

    return finish_after_propagation

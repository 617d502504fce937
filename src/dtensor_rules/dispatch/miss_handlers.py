"""Per-op handlers for DTensor's sharding-cache miss: the table the ``cache_miss_hook`` patch reads.

A handler is ``handler(call, original) -> result``: ``call`` is the miss
(:class:`~dtensor_rules._upstream.CacheMissCall`: ``op_call``, ``args``, ``kwargs``, ``op_info``
by name), ``original`` DTensor's own callback, which ``call.run(original)`` runs unchanged. It
returns what that callback returns: a sharding (DTensor caches it and runs the op) or the op's
result (cached nowhere, so the next such call misses again). An op without a handler goes
straight to DTensor's callback.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dtensor_rules._upstream import CacheMissCall

__all__ = ["MissHandler", "handler_for", "on_miss"]

MissHandler = Callable[[CacheMissCall, Callable[..., Any]], Any]

_HANDLERS: dict[Any, MissHandler] = {}


def on_miss(op: Any, handler: MissHandler) -> None:
    """Have ``handler`` serve every sharding-cache miss of ``op`` (replacing any handler before it)."""
    _HANDLERS[op] = handler


def handler_for(op: Any) -> MissHandler | None:
    """The handler registered for ``op``, or None."""
    return _HANDLERS.get(op)

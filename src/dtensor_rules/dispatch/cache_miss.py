"""The ``cache_miss_hook`` patch: DTensor's sharding-cache-miss callback, routed to per-op handlers.

DTensor's C++ dispatch calls back into Python when a call misses its sharding cache. The hook
hands the miss to the op's handler (:mod:`~dtensor_rules.dispatch.miss_handlers`), or straight
to DTensor's own callback for an op without one; each job is its own handler module:

- ``x[mask]`` on DTensors: :mod:`~dtensor_rules.dispatch.index_masks`;
- finishers, which compute a result for a chosen strategy dispatch cannot run as is (``gather``
  with a masked index): :mod:`~dtensor_rules.dispatch.finishers`.

One thing the hook does for every op: an :class:`~dtensor_rules.dispatch.out_layout.OutLayoutError`
raised by our rule inside DTensor's propagation (an ``out=`` layout no strategy writes) reaches
the user as raised, not inside DTensor's "Sharding propagation failed" wrapper. Calls that hit
the cache never come here: they stay on DTensor's C++ fast path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dtensor_rules._upstream import CacheMissArguments, unwrap_cache_miss, wrap_cache_miss
from dtensor_rules.dispatch import finishers, index_masks  # noqa: F401  (each registers its per-op handlers)
from dtensor_rules.dispatch.miss_handlers import handler_for
from dtensor_rules.dispatch.out_layout import OutLayoutError

__all__ = ["hook"]


def hook(original: Callable[..., Any], arguments: CacheMissArguments) -> Callable[..., Any]:
    """DTensor's cache-miss callback ``original``, routed per op (see the module doc)."""

    def on_cache_miss(*args: Any, **kwargs: Any) -> Any:
        handler = handler_for(arguments.op_call(args, kwargs))
        try:
            if handler is None:
                return original(*args, **kwargs)
            return handler(arguments.bind(args, kwargs), original)
        except RuntimeError as err:
            ours = _out_layout_error_in(err)
            if ours is None or ours is err:
                raise
            raise OutLayoutError(*ours.args) from err

    return on_cache_miss


def _out_layout_error_in(err: BaseException) -> OutLayoutError | None:
    """The :class:`OutLayoutError` ``err`` is or was raised from (DTensor wraps what propagation raises)."""
    seen: set[int] = set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, OutLayoutError):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__
    return None


def _register() -> None:
    from dtensor_rules.patches import Patch, register

    register(Patch(
        name="cache_miss_hook",
        apply=lambda: wrap_cache_miss(hook),
        restore=unwrap_cache_miss,
        changes="DTensor._op_dispatcher._propagate_op_sharding_dispatch_slow_path (an instance attribute "
        "shadowing the method): the callback DTensor's C++ dispatch calls on a sharding-cache miss",
        reason="x[mask] on DTensors and the finishers (gather with a masked index) run here as per-op handlers, "
        "and a clear error for an out= layout no strategy writes surfaces unwrapped; every cached call stays on "
        "DTensor's C++ fast path",
        upstream="missing: DTensor has no way to run an op whose output size depends on the data: x[bool_mask] "
        "(aten.index.Tensor with a bool index) on DTensors raises (checked: torch 2.13.0, 2.14.1)",
        required=True,
    ))


_register()

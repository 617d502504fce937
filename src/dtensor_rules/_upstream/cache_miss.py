"""DTensor's sharding-cache-miss callback: shadow it, and read each call's arguments by name.

DTensor's C++ dispatch calls ``OpDispatcher._propagate_op_sharding_dispatch_slow_path`` when a
call misses its sharding cache; a non-``OutputSharding`` return is taken as the op's result.
Its parameters (``op_call, args, kwargs, op_info, try_cache`` in torch 2.13 and 2.14) are read
from the method's own signature when the wrapper is made, so a release that adds, drops or
reorders one changes nothing here: :class:`CacheMissCall` names the ones we read, and every
argument is passed through to the original as it came.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from dtensor_rules._upstream.registries import SLOW_PATH_ATTR, dispatcher

__all__ = ["SLOW_PATH_ATTR", "CacheMissCall", "cache_miss_wrapped", "is_output_sharding", "unwrap_cache_miss", "wrap_cache_miss"]

# the callback's parameters we read; a release without one of them fails at wrap time, by name
_READ = ("op_call", "args", "kwargs", "op_info")
# "look in the Python sharding cache first" (absent: the release has no such choice)
_TRY_CACHE = "try_cache"

Original = Callable[..., Any]
Handle = Callable[["CacheMissCall", Original], Any]


class CacheMissCall:
    """One call of the cache-miss callback: its arguments by name, passed on unchanged by :meth:`run`."""

    __slots__ = ("_bound",)

    def __init__(self, bound: inspect.BoundArguments) -> None:
        self._bound = bound

    @property
    def op_call(self) -> Any:
        return self._bound.arguments["op_call"]

    @property
    def args(self) -> tuple[Any, ...]:
        return self._bound.arguments["args"]

    @property
    def kwargs(self) -> dict[str, Any]:
        return self._bound.arguments["kwargs"]

    @property
    def op_info(self) -> Any:
        """DTensor's ``OpInfo`` of the call (its schema of specs, local args, mesh)."""
        return self._bound.arguments["op_info"]

    def look_in_python_cache(self) -> None:
        """Have :meth:`run` consult the propagator's Python cache first. DTensor's C++ cache holds
        what that cache would, so it passes "don't" on a plain miss; a call DTensor never caches
        (a finished one) asks again every time, and only the Python cache then saves re-pricing."""
        if _TRY_CACHE in self._bound.signature.parameters:
            self._bound.arguments[_TRY_CACHE] = True

    def run(self, original: Original) -> Any:
        """The original callback on this call's arguments."""
        return original(*self._bound.args, **self._bound.kwargs)


def wrap_cache_miss(handle: Handle) -> None:
    """Shadow the dispatcher's cache-miss callback (an instance attribute) with one that calls
    ``handle(call, original)`` for each miss."""
    d = dispatcher()
    original = getattr(d, SLOW_PATH_ATTR)
    signature = inspect.signature(original)
    missing = [name for name in _READ if name not in signature.parameters]
    if missing:
        raise RuntimeError(
            f"DTensor's {SLOW_PATH_ATTR} takes {list(signature.parameters)}, without {missing}: this torch "
            "release changed the cache-miss callback; install without the 'cache_miss_hook' patch"
        )

    def on_cache_miss(*args: Any, **kwargs: Any) -> Any:
        return handle(CacheMissCall(signature.bind(*args, **kwargs)), original)

    setattr(d, SLOW_PATH_ATTR, on_cache_miss)


def unwrap_cache_miss() -> None:
    """Undo :func:`wrap_cache_miss`: the class method shows through again."""
    d = dispatcher()
    if SLOW_PATH_ATTR in vars(d):
        delattr(d, SLOW_PATH_ATTR)


def cache_miss_wrapped() -> bool:
    """Whether :func:`wrap_cache_miss` is in effect."""
    return SLOW_PATH_ATTR in vars(dispatcher())


def is_output_sharding(x: Any) -> bool:
    """Whether a cache-miss callback's return is a sharding decision (DTensor caches and runs it)
    rather than the op's result."""
    from torch.distributed.tensor._op_schema import OutputSharding

    return isinstance(x, OutputSharding)

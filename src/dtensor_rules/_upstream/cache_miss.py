"""DTensor's sharding-cache-miss callback: shadow it, and read each call's arguments by name.

DTensor's C++ dispatch calls ``OpDispatcher._propagate_op_sharding_dispatch_slow_path`` when a
call misses its sharding cache; a non-``OutputSharding`` return is taken as the op's result.
Its parameters (``op_call, args, kwargs, op_info, try_cache`` in torch 2.13 and 2.14) are read
from the method's own signature when the wrapper is made, so a release that adds or reorders
parameters changes nothing here, and one that drops a parameter we read fails at install naming
it: :class:`CacheMissArguments` finds the ones we read by name, :class:`CacheMissCall` holds one
call's, and every argument reaches the original as it came.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from dtensor_rules._upstream.registries import SLOW_PATH_ATTR, dispatcher

__all__ = [
    "SLOW_PATH_ATTR",
    "CacheMissArguments",
    "CacheMissCall",
    "cache_miss_wrapped",
    "is_output_sharding",
    "unwrap_cache_miss",
    "wrap_cache_miss",
]

# the callback's parameters we read; a release without one of them fails at wrap time, by name
_READ = ("op_call", "args", "kwargs", "op_info")
# "look in the Python sharding cache first" (absent: the release has no such choice)
_TRY_CACHE = "try_cache"

Original = Callable[..., Any]


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


class CacheMissArguments:
    """Reads a cache-miss call's arguments by the names in the callback's own signature."""

    __slots__ = ("_op_call_at", "_signature")

    def __init__(self, callback: Original) -> None:
        self._signature = inspect.signature(callback)
        names = list(self._signature.parameters)
        missing = [name for name in _READ if name not in names]
        if missing:
            raise RuntimeError(
                f"DTensor's {SLOW_PATH_ATTR} takes {names}, without {missing}: this torch release changed "
                "the cache-miss callback; install without the 'cache_miss_hook' patch"
            )
        positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        at = names.index("op_call")
        self._op_call_at = at if self._signature.parameters["op_call"].kind in positional else len(names)

    def op_call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The op of a call, read without binding every argument (the hook asks it on every miss)."""
        return args[self._op_call_at] if len(args) > self._op_call_at else kwargs["op_call"]

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> CacheMissCall:
        """The call with every argument by name."""
        return CacheMissCall(self._signature.bind(*args, **kwargs))


def wrap_cache_miss(make: Callable[[Original, CacheMissArguments], Original]) -> None:
    """Shadow the dispatcher's cache-miss callback (an instance attribute) with
    ``make(original, arguments)``, ``arguments`` reading each call's arguments by name."""
    d = dispatcher()
    original = getattr(d, SLOW_PATH_ATTR)
    setattr(d, SLOW_PATH_ATTR, make(original, CacheMissArguments(original)))


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

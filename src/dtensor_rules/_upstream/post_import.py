"""Run a callback right after a module is first imported (a post-import hook).

Why: what we add to a heavy torch module should arrive when the *user* imports it, not cost
every ``import dtensor_rules``: DCP's planner helpers pull in ~70 ms of FSDP, elastic and
sharded-tensor modules; ``torch.utils.flop_counter`` imports triton on CUDA builds (~100 ms,
~75 MiB). Upstream defers its own prims.fma rule the same way
(``_upstream.meta.on_prims_fma_defined``); these modules have no such callback, so a
``sys.meta_path`` finder wraps the module's loader and calls back once the module body has run.
"""

from __future__ import annotations

import importlib.abc
import sys
import threading
from collections.abc import Callable
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

__all__ = ["when_imported"]

Callback = Callable[[ModuleType], None]

_lock = threading.Lock()
_pending: dict[str, list[Callback]] = {}  # module name -> callbacks still waiting for its import


class _CallbackLoader(importlib.abc.Loader):
    """The module's own loader, plus the pending callbacks once its body has run."""

    def __init__(self, loader: Any, name: str) -> None:
        self._loader = loader
        self._name = name

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # introspection (linecache, inspect, pkgutil) sees the real loader, as without the hook
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        with _lock:
            callbacks = _pending.pop(self._name, [])
            _drop_finder_if_idle()
        for callback in callbacks:  # an error here propagates: a fix silently missing would be worse
            callback(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: asks the finders after it and wraps the loader of a watched module."""

    def find_spec(self, fullname: str, path: Any, target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname not in _pending:
            return None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _CallbackLoader(spec.loader, fullname)
        return spec


_FINDER = _Finder()


def _drop_finder_if_idle() -> None:
    if not _pending and _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)


def when_imported(name: str, callback: Callback) -> Callable[[], None]:
    """Call ``callback(module)`` now if ``name`` is imported, else right after its first import.

    Returns ``cancel()``: forgets the callback if it has not run yet (no-op afterwards).
    """
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
        return lambda: None
    with _lock:
        _pending.setdefault(name, []).append(callback)
        if _FINDER not in sys.meta_path:
            sys.meta_path.insert(0, _FINDER)  # before the path finders that would load it

    def cancel() -> None:
        with _lock:
            waiting = _pending.get(name, [])
            if callback in waiting:
                waiting.remove(callback)
                if not waiting:
                    del _pending[name]
            _drop_finder_if_idle()

    return cancel

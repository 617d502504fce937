"""Every change ``import dtensor_rules`` makes in torch beyond installing rules, by name.

A :class:`Patch` says what it changes in torch (``changes``), why (``reason``), which upstream
defect or missing feature it stands in for and on which torch releases that was checked
(``upstream``: tests/test_upstream_gaps.py runs each gap's reproducer on torch alone, so a release
that closes it fails that test and the patch can be version-gated off), and whether
correctness needs it (``required``: on by default) or it is optional (off unless asked for, or
on by default with ``default=True`` where it only saves time and leaves every result the same).
Each has ``apply`` / ``restore`` functions that undo each other exactly (the original function
objects come back). The module that owns the fix registers it with :func:`register`, the one
registration API; this module imports nothing of the package, so any layer may register one.

Switching: ``dtensor_rules.install()`` applies the default set (every ``required`` patch),
``install(patches=[...])`` makes the applied set exactly the names given (``[]``: none),
``uninstall()`` restores all of them. :func:`states` (also ``dtensor_rules.status().patches``
and ``python -m dtensor_rules status``) lists each with its reason and state. docs/patches.md
is the page a user reads.

Some patches complete at someone else's import (``waits_for``: DCP, ``torch.utils.flop_counter``,
inductor's prims): their callback runs through :func:`guarded`, so a failure there becomes a
warning and a ``failed`` state, never an exception in the importer's code.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

__all__ = ["Patch", "PatchState", "UPSTREAM_KINDS", "register", "apply", "restore", "set_applied", "applied", "defaults",
           "names", "states", "guarded", "check_names", "PatchError"]


class PatchError(ValueError):
    """An unknown patch name, or a patch registered twice."""


class Patch(NamedTuple):
    """One named global change to torch (see the module docstring)."""

    name: str
    changes: str
    reason: str
    upstream: str  # "defect: ..." or "missing: ...", ending "(checked: torch 2.13.0, 2.14.1)"
    required: bool
    apply: Callable[[], None]
    restore: Callable[[], None]
    waits_for: str = ""  # module whose first import completes the patch ("" = complete when applied)
    pending: Callable[[], bool] | None = None  # while applied: is the waits_for part still to come?
    default: bool | None = None  # applied by a plain install()? None: exactly when required

    @property
    def on_by_default(self) -> bool:
        return self.required if self.default is None else self.default


class PatchState(NamedTuple):
    """What ``status()`` reports for one patch."""

    name: str
    state: str  # "on", "on, waiting: ...", "off", "failed: ..."
    required: bool
    changes: str
    reason: str
    upstream: str  # the upstream defect or missing feature it stands in for, and where that was checked
    default: bool  # applied by a plain install()


_lock = threading.RLock()
_patches: dict[str, Patch] = {}
_applied: list[str] = []  # in application order
_failed: dict[str, str] = {}  # name -> why its deferred part failed (cleared by restore)


UPSTREAM_KINDS = ("defect: ", "missing: ")


def register(patch: Patch) -> Patch:
    """Make ``patch`` known (not applied: :func:`apply` or ``dtensor_rules.install()`` does that).

    ``patch.upstream`` must name the gap: ``"defect: ..."`` (torch gives a wrong result or an
    error) or ``"missing: ..."`` (torch lacks the feature), with the releases where it was checked.
    """
    if not patch.upstream.startswith(UPSTREAM_KINDS) or "(checked: torch " not in patch.upstream:
        raise PatchError(f"patch {patch.name!r}: upstream= must start with 'defect: ' or 'missing: ' and end with "
                         f"'(checked: torch X.Y.Z, ...)', got {patch.upstream!r}")
    with _lock:
        if patch.name in _patches:
            raise PatchError(f"patch {patch.name!r} is already registered")
        _patches[patch.name] = patch
    return patch


def names() -> list[str]:
    """Every registered patch name, in registration order."""
    return list(_patches)


def defaults() -> list[str]:
    """The patches a plain ``dtensor_rules.install()`` applies: the ones correctness needs, and the
    optional ones that are on by default (``Patch.default``)."""
    return [n for n, p in _patches.items() if p.on_by_default]


def applied() -> list[str]:
    """The patches in effect now, in the order they were applied."""
    return list(_applied)


def check_names(requested: Iterable[str]) -> list[str]:
    """``requested`` as a list; PatchError naming the known patches if one is unknown."""
    if isinstance(requested, str):
        raise PatchError(f"patches= takes a list of names, got the string {requested!r}")
    wanted = list(requested)
    unknown = [n for n in wanted if n not in _patches]
    if unknown:
        raise PatchError(f"unknown patch(es) {unknown}; known: {names()} (docs/patches.md)")
    return wanted


def apply(names_: Sequence[str]) -> list[str]:
    """Apply the named patches not yet applied; returns those it applied now."""
    done = []
    with _lock:
        for name in check_names(names_):
            if name not in _applied:
                _patches[name].apply()
                _applied.append(name)
                done.append(name)
    return done


def restore(names_: Sequence[str] | None = None) -> list[str]:
    """Restore the named applied patches (all when None), last applied first; returns them."""
    with _lock:
        targets = set(_applied if names_ is None else check_names(names_))
        done = [n for n in reversed(_applied) if n in targets]
        for name in done:
            _patches[name].restore()
            _applied.remove(name)
            _failed.pop(name, None)
    return done


def set_applied(names_: Sequence[str]) -> None:
    """Make the applied set exactly ``names_`` (restoring the others)."""
    with _lock:
        wanted = check_names(names_)
        restore([n for n in _applied if n not in wanted])
        apply(wanted)


def guarded(name: str, callback: Callable[..., None]) -> Callable[..., None]:
    """``callback`` for someone else's import: an exception becomes a warning and patch ``name``'s
    ``failed`` state (status() shows it), so the importer's code never sees it."""

    def run(*args: Any) -> None:
        try:
            callback(*args)
        except Exception as err:  # noqa: BLE001 - reported, never raised into an unrelated import
            why = f"{type(err).__name__}: {err}"
            _failed[name] = why
            warnings.warn(
                f"dtensor_rules: patch {name!r} failed when it completed at a later import ({why}); its fix is "
                f"not in effect. `python -m dtensor_rules status` shows it; docs/patches.md says how to turn it off.",
                RuntimeWarning,
                stacklevel=2,
            )

    return run


def states() -> dict[str, PatchState]:
    """name -> :class:`PatchState` of every registered patch."""
    out = {}
    with _lock:
        for name, p in _patches.items():
            if name in _failed:
                state = f"failed: {_failed[name]}"
            elif name not in _applied:
                state = "off"
            elif p.pending is not None and p.pending():
                state = f"on, waiting: completes when {p.waits_for} is first imported"
            else:
                state = "on"
            out[name] = PatchState(name, state, p.required, p.changes, p.reason, p.upstream, p.on_by_default)
    return out

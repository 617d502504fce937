"""Shared by the per-call dispatch benchmarks: time one call, and alternate upstream / ours rounds."""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import dtensor_rules


def per_call_us(fn: Callable[[], Any], calls: int) -> float:
    """Mean per-call time (us) of ``calls`` calls; a warm-up call first fills the caches."""
    fn()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


class CaseRounds(NamedTuple):
    """One case's per-round times on each side, and what its last call returned there."""

    times: dict[str, list[float]]
    result: dict[str, Any]

    def summary(self) -> tuple[float | None, ...]:
        """(median upstream, median ours, min upstream, min ours); None where a side never ran it."""
        return tuple(f(self.times[s]) if self.times[s] else None for f in (statistics.median, min) for s in ("upstream", "ours"))


def interleaved_rounds(cases: Callable[[], dict[str, Callable[[], Any]]], calls: int, repeats: int) -> dict[str, CaseRounds]:
    """``repeats`` rounds, each upstream (our rules and patches uninstalled) then ours: the machine
    is shared, and interleaving spreads its load noise over both sides. A case that raises on a
    side (upstream cannot run it) has no times there."""
    out: dict[str, CaseRounds] = {}
    for _ in range(repeats):
        for side in ("upstream", "ours"):
            dtensor_rules.uninstall() if side == "upstream" else dtensor_rules.install()
            for name, fn in cases().items():
                case = out.setdefault(name, CaseRounds({"upstream": [], "ours": []}, {}))
                try:
                    case.times[side].append(per_call_us(fn, calls))
                except Exception:
                    continue
                case.result[side] = fn()
    return out


def run_rounds(worker: Callable[..., Any]) -> tuple[Any, argparse.Namespace]:
    """``--calls`` / ``--repeats`` from the command line, then ``worker(rank, world, calls, repeats)``
    on a real 2-rank gloo group; rank 0's result, and the arguments.

    ``--fake``: in this process on a 2-rank ``fake`` group instead (rank 0; collectives are
    no-ops), so only dispatch is timed, without a second process competing for the 2 cores.
    """
    from dtensor_rules.testing import fake_world, run_gloo

    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--fake", action="store_true", help="one process, a 2-rank fake group: dispatch alone")
    a = ap.parse_args()
    a.group = "fake group, one process" if a.fake else "gloo"  # for the scripts' headers
    if a.fake:
        with fake_world(2):
            return worker(0, 2, a.calls, a.repeats), a
    return run_gloo(worker, 2, a.calls, a.repeats)[0], a

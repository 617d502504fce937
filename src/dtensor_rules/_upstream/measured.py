"""Which of two rules (ours, upstream's) to keep for an op, decided from measured data.

``measured_<major>_<minor>.json`` next to this module holds, per op, ours and upstream's
correct / incorrect / missing layout counts against ground truth on the sample suites
(:data:`REGENERATE`, run with each tested torch release, writes that release's file;
``tests/test_upstream_measured.py`` names it when a file no longer covers the shipped rules) and, for
layout-preserving ops, the shard-order probe. :func:`verdict` keeps ours only where it is
measured strictly better, correctness first: ours has no incorrect layout, and upstream has one
(DTensor would silently compute a wrong result with it), or ours offers more correct layouts,
or coverage is equal and upstream loses a shard order ours keeps. Otherwise upstream's rule
stays, and the reason says why. No file for the running torch: upstream is kept wherever
it has a rule (a release we have not measured may have fixed what ours fixes).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, NamedTuple

from dtensor_rules._upstream.version import TORCH_VERSION

HERE = Path(__file__).parent
# the one command that regenerates the running torch's file (mesh 2, every overload, the ops both
# sides have a rule for); run it with each tested release's python (~3-4 min each on 2 cores)
REGENERATE = "python benchmarks/rule_coverage.py --write-measured"
MEASURED_MESHES = ((2,),)


class Verdict(NamedTuple):
    """The rule to keep for one op where both sides have one, and why (for ``status()``)."""

    keep: str  # "ours" | "upstream"
    why: str


class Totals(NamedTuple):
    """One side's counts summed over the measured meshes."""

    correct: int
    incorrect: int


def measured_path(version: tuple[int, int] = TORCH_VERSION) -> Path:
    return HERE / f"measured_{version[0]}_{version[1]}.json"


@functools.lru_cache(maxsize=None)
def load(version: tuple[int, int] = TORCH_VERSION) -> dict[str, Any] | None:
    """The measured document for ``version`` (None if that release was never measured)."""
    path = measured_path(version)
    return json.loads(path.read_text()) if path.exists() else None


def _totals(record: dict[str, Any], side: str) -> Totals | None:
    meshes = [v for k, v in record.items() if k != "shard_order"]
    if any(m[side] is None for m in meshes):
        return None
    return Totals(sum(m[side]["correct"] for m in meshes), sum(m[side]["incorrect"] for m in meshes))


def decide(record: dict[str, Any] | None, label: str = "") -> Verdict:
    """Ours only if measured strictly better than upstream (see the module docstring)."""
    if record is None:
        return Verdict("upstream", f"upstream kept: not measured on torch {label}".rstrip())
    ours, up = _totals(record, "ours"), _totals(record, "upstream")
    if ours is None:
        return Verdict("upstream", "upstream kept: ours was not measured")
    if up is None:
        return Verdict("ours", f"ours: {ours.correct} correct, upstream had no rule when measured")
    order = record.get("shard_order", {})
    lost_order = order.get("upstream", "kept") != "kept" and order.get("ours") == "kept"
    tally = f"{ours.correct} correct vs upstream {up.correct}"
    if up.incorrect:
        tally += f", upstream {up.incorrect} incorrect"
    if ours.incorrect:
        return Verdict("upstream", f"upstream kept: ours {ours.incorrect} incorrect ({tally})")
    if up.incorrect:  # a layout computing a wrong result outweighs any number of extra right ones
        return Verdict("ours", f"ours: {tally}")
    if ours.correct < up.correct:
        return Verdict("upstream", f"upstream kept: more correct ({tally})")
    if ours.correct > up.correct:
        return Verdict("ours", f"ours: {tally}")
    if lost_order:
        return Verdict("ours", f"ours: equal coverage ({ours.correct} correct), upstream shard order "
                               f"{order['upstream']}, ours kept")
    return Verdict("upstream", f"upstream kept: equal coverage ({ours.correct} correct each)")


def verdict(op: Any, version: tuple[int, int] = TORCH_VERSION) -> Verdict:
    """:func:`decide` on the running torch's measured record of ``op``."""
    doc = load(version)
    label = f"{version[0]}.{version[1]}"
    if doc is None:
        return Verdict("upstream", f"upstream kept: torch {label} not measured")
    return decide(doc["ops"].get(str(op)), label)

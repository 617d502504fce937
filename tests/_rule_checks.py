"""Assertions shared by every rule's property tests."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import torch

from dtensor_rules.testing import check_rule, simulated_mesh
from dtensor_rules.testing.dispatch import sharded_call
from dtensor_rules.testing.simulate import Sample
from dtensor_rules.testing.tables import emitted


# Below this many elements a wrong layout can reproduce the truth by coincidence on every
# variant, so "valid by ground truth" is not evidence that a rule misses something.
MIN_NUMEL_FOR_COMPLETENESS = 4


def _constant_output(op: Any, args: Sequence[Any], kwargs: dict | None) -> bool:
    """A constant result (e.g. softmax backward over a size-1 dim is identically 0) is reproduced by
    any layout whose pieces reduce to that constant, so ground truth marks them all valid."""
    out = op(*args, **(kwargs or {}))
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return all(o.numel() == 0 or bool((o == o.flatten()[0]).all()) for o in outs)


def assert_rule_sound_and_complete(op: Any, args: Sequence[Any], kwargs: dict | None, mesh_shape: Sequence[int], complete: bool = True) -> None:
    """Every strategy we emit reproduces single-device results; we offer at least upstream's valid ones.

    With ``complete``, also no ground-truth-valid combo is missing (on samples large enough to tell).
    """
    report = check_rule(op, args, kwargs, mesh_shape)
    assert report.ours.error is None, report.ours.error
    assert report.ours.incorrect == 0, report.summary()
    assert report.ours.correct >= report.upstream.correct, report.summary()
    tensors = Sample(tuple(args), dict(kwargs or {})).tensors()
    if complete and min(t.numel() for t in tensors) >= MIN_NUMEL_FOR_COMPLETENESS and not _constant_output(op, args, kwargs):
        assert report.ours.missing == 0, report.ours.missing_combos[:10]


def assert_dispatch_matches(op: Any, args: Sequence[Any], kwargs: dict | None, mesh_shape: Sequence[int], seed: int, n: int = 3, atol: float | None = None) -> None:
    """Run a few emitted strategies through real DTensor dispatch; compare with single device."""
    combos = sorted(emitted(op, args, kwargs, mesh_shape), key=str)
    expected = op(*args, **(kwargs or {}))
    sample = Sample(tuple(args), dict(kwargs or {}))
    rng = random.Random(seed)
    with simulated_mesh(tuple(mesh_shape)) as mesh:
        for ins, _outs in rng.sample(combos, min(n, len(combos))):
            got = sharded_call(op, sample, mesh, ins)
            exp = expected if isinstance(expected, tuple) else (expected,)
            got_t = got if isinstance(got, tuple) else (got,)
            for g, e in zip(got_t, exp):
                tol = {} if atol is None else {"atol": atol, "rtol": atol}
                if e.dtype == torch.bfloat16 and atol is None:
                    tol = {"atol": 0.1, "rtol": 0.05}
                torch.testing.assert_close(g, e, **tol, msg=lambda m: f"{op} with inputs {ins}: {m}")

"""Each patch of ``import dtensor_rules`` stands in for an upstream gap that still exists.

Every patch (and the simulated-mesh RNG fix, which ``simulated_mesh()`` applies) names its gap in
``upstream``. Each gap's minimal reproducer (tests/upstream_gap_reproducers.py) runs on torch
ALONE: one fresh interpreter that never imports the package runs them all and prints one JSON
line. When a torch release closes a gap, the test for it fails and names the patch to
version-gate off.

The same reproducers run once more after ``import dtensor_rules``: those whose patch fixes the
very place the reproducer looks must then report "fixed", so a reproducer that cannot tell a
fixed torch from a broken one fails here rather than passing forever.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dtensor_rules import patches
from dtensor_rules.testing.simulated_rng import UPSTREAM_GAP as SIMULATED_RNG_GAP
from tests._session_once import once_per_session

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
# the simulator fix is no patch (simulated_mesh applies it), but it stands in for a gap all the same
SIMULATED_RNG = "per_rank_generators"
# patches whose fix sits elsewhere than where the reproducer looks: meta_fallback answers in
# DTensor's metadata step (the meta kernel keeps its check); ours replaces upstream's fma entry
# instead of changing upstream's rows; the RNG fix is applied inside simulated_mesh() only
FIXED_ELSEWHERE = {"meta_fallback", "deferred_fma", SIMULATED_RNG}

REPRODUCERS = Path(__file__).with_name("upstream_gap_reproducers.py")


def _run(torch_alone: bool) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))  # this checkout (ignored by -I)
    if torch_alone:
        argv = [sys.executable, "-I", str(REPRODUCERS), "--torch-alone"]
    else:
        argv = [sys.executable, "-c", f"import dtensor_rules, runpy; runpy.run_path({str(REPRODUCERS)!r})"]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])["gaps"]


@pytest.fixture(scope="module")
def on_torch_alone(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return once_per_session(tmp_path_factory, "reproducers_on_torch_alone", lambda _: _run(torch_alone=True))[0]


def _upstream_lines() -> dict[str, str]:
    return {**{n: s.upstream for n, s in patches.states().items()}, SIMULATED_RNG: SIMULATED_RNG_GAP}


def test_every_patch_has_a_reproducer(on_torch_alone: dict[str, str]) -> None:
    assert set(on_torch_alone) == set(_upstream_lines())


@pytest.mark.parametrize("name", sorted(_upstream_lines()))
def test_the_upstream_gap_is_still_there(on_torch_alone: dict[str, str], name: str) -> None:
    import torch

    got, upstream = on_torch_alone[name], _upstream_lines()[name]
    assert got != "fixed", (
        f"torch {torch.__version__} no longer has the gap that {name!r} stands in for ({upstream}): "
        f"version-gate {name!r} off for this release and record it in its upstream= line"
    )
    assert got == "gap", f"the reproducer for {name!r} broke on torch {torch.__version__}: {got}"


def test_with_the_package_the_reproducers_see_the_fix() -> None:
    with_package = _run(torch_alone=False)
    fixed_here = {n: v for n, v in with_package.items() if n not in FIXED_ELSEWHERE}
    assert fixed_here and all(v == "fixed" for v in fixed_here.values()), fixed_here

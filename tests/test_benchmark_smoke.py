"""benchmarks/planner_vs_upstream.py --quick is a smoke run: bounded work, tables on stdout, readable
progress on stderr (a readable line per step, never a raw dict). No timing is asserted."""

from __future__ import annotations

import pytest

import os
import subprocess
import sys
from pathlib import Path

pytestmark = pytest.mark.slow  # starts processes (see pyproject.toml)

ROOT = Path(__file__).resolve().parent.parent


def test_planner_benchmark_quick_leaves_out_the_heavy_configs_and_prints_no_raw_dicts() -> None:
    # (run as a subprocess: importing the script would set DTENSOR_RULES_NO_INSTALL in this process)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    run = subprocess.run([sys.executable, "benchmarks/planner_vs_upstream.py", "--quick", "--only", "2x2x2x2", "--n", "1"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stderr.splitlines()
    assert lines[0].startswith("planner_vs_upstream: --quick leaves out 3 4-D mesh x 4-D tensor config(s)")
    assert len(lines) == 2 and lines[1].startswith("planner_vs_upstream: 1/1 mesh (2, 2, 2, 2) tensor (256, 256, 256)")
    assert "{" not in run.stderr
    assert "| (2, 2, 2, 2) | (256, 256, 256) | even | 1 |" in run.stdout


def test_moe_vs_torchtitan_quick_prints_the_table() -> None:
    """benchmarks/moe_vs_torchtitan.py --quick (ep2, 2 gloo ranks, 1 round; ~30 s, mostly torchtitan's import):
    both paths run on the same tokens and the table has their rows with equal all-to-all bytes."""
    from tests._torchtitan import require_torchtitan

    require_torchtitan()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    run = subprocess.run([sys.executable, "benchmarks/moe_vs_torchtitan.py", "--quick"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [line for line in run.stdout.splitlines() if line.startswith("| ep2 |")]
    assert [r.split(" | ")[1] for r in rows] == ["torchtitan", "ours"], run.stdout
    a2a = [r.split(" | ")[3] for r in rows]  # "calls / KiB" of all_to_all
    assert a2a[0] == a2a[1] and a2a[0].startswith("5 / "), rows

"""`python -m dtensor_rules` / `./run.sh`: JSON contract, exit codes, a clean and fast first use (the wording
of help and error messages: tests/test_messages.py)."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from dtensor_rules.cli.main import HARDWARE, main, parse_mesh
from dtensor_rules._upstream import TORCH_VERSION
from dtensor_rules.testing.suites import suites
from tests._fake_run_sh import fake_run_sh
from tests._fresh import ROOT, run_python

ALL_OPS = sorted(str(op) for op in suites())


# ops where upstream's rule offers more correct layouts than ours on mesh 2, per torch release;
# each also offers incorrect ones (install() keeps ours: correctness first, see _upstream/measured.py)
FEWER_CORRECT_THAN_UPSTREAM = {(2, 13): set(), (2, 14): {"aten.cumsum.default"}}[TORCH_VERSION]


def last_json_line(text: str) -> dict:
    """stdout under --json is exactly one JSON document (what `| python -m json.tool` needs)."""
    return json.loads(text)


def cli(*args: str) -> subprocess.CompletedProcess:
    """``python -m dtensor_rules ARGS`` in a fresh process (``tests/_fresh.py``)."""
    return run_python(module="dtensor_rules", args=args)


def clean(stderr: str) -> bool:
    """No error logs or tracebacks (what a successful first run must look like)."""
    return "Traceback" not in stderr and "ERROR" not in stderr and "[rank" not in stderr


@pytest.mark.slow  # over ~9 s of the inner loop (pyproject.toml)
@pytest.mark.parametrize("op", ALL_OPS)
def test_validate_json_for_every_op_with_a_suite(op, capsys):
    assert main(["validate", "--op", op, "--mesh", "2", "--json"]) == 0
    report = last_json_line(capsys.readouterr().out)
    assert report["op"] == op and report["mesh"] == [2]
    assert report["ours"]["incorrect"] == 0
    if op in FEWER_CORRECT_THAN_UPSTREAM:
        # upstream offers the layouts ours leaves out (P(sum) where a sample's dtype makes it
        # invalid) and is wrong on them: ours' "missing" are layouts right only by luck
        assert report["upstream"]["incorrect"] > 0 and report["ours"]["correct"] < report["upstream"]["correct"]
    else:
        assert report["ours"]["correct"] >= report["upstream"]["correct"]
    assert set(report["ours"]) == set(report["upstream"]) == {"correct", "incorrect", "missing"}


@pytest.mark.slow
def test_validate_on_2x2_from_a_fresh_process_prints_only_json():
    run = cli("validate", "--op", "cumsum", "--mesh", "2x2", "--json")
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout)  # the whole stdout: no summary line before it
    assert report["op"] == "aten.cumsum.default" and report["mesh"] == [2, 2]


@pytest.mark.parametrize("text, shape", [("2", (2,)), ("2x2", (2, 2)), ("2X2x2", (2, 2, 2))])
def test_mesh_parsing(text, shape):
    assert parse_mesh(text) == shape


def test_status_lists_active_rules(capsys):
    assert main(["status"]) == 0
    out = capsys.readouterr().out
    assert "aten._grouped_mm.default" in out and "ours" in out


def test_run_sh_test_installs_the_extras_ci_uses(tmp_path):
    """`./run.sh test` installs what .ci/run sets (EXTRAS=test,triton,solver,torchtitan), so no test skips
    for a missing extra; an explicit EXTRAS still wins (.ci/run sets it itself)."""
    env, log = fake_run_sh(tmp_path)
    ci_extras = re.search(r"EXTRAS=([\w,]+)", (ROOT / ".ci" / "run").read_text()).group(1)
    run = subprocess.run(["bash", "run.sh", "test", "-x"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout == "ran -m pytest -n 2 -q -x\n", run.stderr
    assert f'-e .[{ci_extras}]' in log.read_text() and "-c constraints.txt" in log.read_text()
    assert f"installing dtensor_rules[{ci_extras}] with torch 2.13.0" in run.stderr

    light = tmp_path / "light"
    light.mkdir()
    env, log = fake_run_sh(light)
    run = subprocess.run(["bash", "run.sh", "test"], cwd=light, env={**env, "EXTRAS": "test"}, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0 and "-e .[test]" in log.read_text()
    run = subprocess.run(["bash", "run.sh", "status"], cwd=light, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and log.read_text().count("pip install") == 1  # status wants no extra: no pip run

"""`python -m dtensor_rules` / `./run.sh`: JSON contract, errors, exit codes, a clean and fast first use."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dtensor_rules.__main__ import HARDWARE, build_parser, main, parse_mesh
from dtensor_rules.testing.suites import suites

ALL_OPS = sorted(str(op) for op in suites())
ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def last_json_line(text: str) -> dict:
    """stdout under --json is exactly one JSON document (what `| python -m json.tool` needs)."""
    return json.loads(text)


def cli(*args: str, importtime: bool = False) -> subprocess.CompletedProcess:
    flags = ["-X", "importtime"] if importtime else []
    return subprocess.run([sys.executable, *flags, "-m", "dtensor_rules", *args], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=600)


def clean(stderr: str) -> bool:
    """No error logs or tracebacks (what a successful first run must look like)."""
    return "Traceback" not in stderr and "ERROR" not in stderr and "[rank" not in stderr


@pytest.mark.parametrize("op", ALL_OPS)
def test_validate_json_for_every_op_with_a_suite(op, capsys):
    assert main(["validate", "--op", op, "--mesh", "2", "--json"]) == 0
    report = last_json_line(capsys.readouterr().out)
    assert report["op"] == op and report["mesh"] == [2]
    assert report["ours"]["incorrect"] == 0
    assert report["ours"]["correct"] >= report["upstream"]["correct"]
    assert set(report["ours"]) == set(report["upstream"]) == {"correct", "incorrect", "missing"}


def test_validate_on_2x2_from_a_fresh_process_prints_only_json():
    run = cli("validate", "--op", "cumsum", "--mesh", "2x2", "--json")
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout)  # the whole stdout: no summary line before it
    assert report["op"] == "aten.cumsum.default" and report["mesh"] == [2, 2]
    assert report["ours"]["incorrect"] == 0 and report["ours"]["correct"] > report["upstream"]["correct"]
    assert clean(run.stderr), run.stderr[-3000:]
    tool = subprocess.run([sys.executable, "-m", "json.tool"], input=run.stdout, capture_output=True, text=True)
    assert tool.returncode == 0


def test_validate_without_json_prints_the_summary(capsys):
    assert main(["validate", "--op", "fma", "--mesh", "2"]) == 0
    out = capsys.readouterr().out
    assert "prims.fma.default" in out and not out.lstrip().startswith("{")


def test_every_op_status_lists_can_be_validated_or_is_explained(capsys):
    """`status` lists moe_permute_indices: validate runs it; ops without a suite get a clear reason."""
    assert main(["validate", "--op", "moe_permute_indices", "--mesh", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["op"] == "dtensor_rules.moe_permute_indices.default" and report["ours"]["incorrect"] == 0
    assert main(["validate", "--op", "aten.cumsum.out"]) == 2
    err = capsys.readouterr().err
    assert "aten.cumsum.out has our rule" in err and "no sample suite" in err


def test_help_and_typos_answer_without_importing_torch():
    for args, rc in ((("--help",), 0), (("valdiate",), 2), (("validate", "--help"), 0), ((), 2)):
        run = cli(*args, importtime=True)
        assert run.returncode == rc, (args, run.stderr[-2000:])
        imported = [ln.rsplit("|", 1)[-1].strip() for ln in run.stderr.splitlines() if ln.startswith("import time:")]
        assert "dtensor_rules" in imported  # the probe sees our imports, so an absent torch means not imported
        assert not [m for m in imported if m == "torch" or m.startswith("torch.")], (args, "torch was imported")
    assert "invalid choice: 'valdiate'" in cli("valdiate").stderr


def test_run_sh_without_a_command_prints_help(tmp_path):
    """No argument (and a typo) is answered before any .venv is created or anything installed."""
    script = tmp_path / "run.sh"
    shutil.copy(ROOT / "run.sh", script)
    run = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "usage: ./run.sh COMMAND" in run.stdout and run.stderr == ""
    for word in ("demo", "test", "validate", "status", "coverage"):
        assert f"\n  {word} " in run.stdout
    assert set(build_parser()._subparsers._group_actions[0].choices) == {"demo", "validate", "status", "coverage"}
    typo = subprocess.run(["bash", str(script), "valdiate"], capture_output=True, text=True, timeout=60)
    assert typo.returncode == 2 and "unknown command 'valdiate'" in typo.stderr
    assert not (tmp_path / ".venv").exists()


def test_status_and_coverage_from_a_fresh_process_are_clean():
    status = cli("status")
    assert status.returncode == 0 and "dtensor_rules.moe_permute_indices.default" in status.stdout
    assert clean(status.stderr), status.stderr[-3000:]
    cov = cli("coverage", "--mesh", "2x2", "--hardware", "a100")
    assert cov.returncode == 0, cov.stdout[-2000:] + cov.stderr[-2000:]
    assert "traced: the demo's MoE block" in cov.stdout and "permute_impl='kernel'" in cov.stdout
    assert clean(cov.stderr), cov.stderr[-3000:]


def test_coverage_hardware_choices_are_the_cost_profiles():
    from dtensor_rules.costs import HARDWARE as PROFILES

    assert set(HARDWARE) == set(PROFILES)
    assert build_parser().parse_args(["coverage", "--hardware", "a100"]).hardware == "a100"


def test_unknown_op_is_a_clear_error(capsys):
    assert main(["validate", "--op", "no_such_op"]) == 2
    err = capsys.readouterr().err
    assert "unknown op 'no_such_op'" in err and "aten.cumsum.default" in err


@pytest.mark.parametrize("text, shape", [("2", (2,)), ("2x2", (2, 2)), ("2X2x2", (2, 2, 2))])
def test_mesh_parsing(text, shape):
    assert parse_mesh(text) == shape


@pytest.mark.parametrize("text", ["", "2x", "0", "2x2x2x2", "two"])
def test_bad_mesh_is_rejected(text, capsys):
    with pytest.raises(SystemExit):
        main(["validate", "--op", "fma", "--mesh", text])
    assert "mesh must" in capsys.readouterr().err


def test_status_lists_active_rules(capsys):
    assert main(["status"]) == 0
    out = capsys.readouterr().out
    assert "aten._grouped_mm.default" in out and "ours" in out

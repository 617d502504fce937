"""`python -m dtensor_rules` / `./run.sh`: JSON contract, errors, exit codes, a clean and fast first use."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess

import pytest

from dtensor_rules.cli.main import HARDWARE, build_parser, main, parse_mesh
from dtensor_rules._upstream import TORCH_VERSION
from dtensor_rules.testing.suites import suites
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


def test_unknown_op_is_a_clear_error(capsys):
    assert main(["validate", "--op", "no_such_op"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown op 'no_such_op'") and "--import MODULE" in err


@pytest.mark.parametrize("text, shape", [("2", (2,)), ("2x2", (2, 2)), ("2X2x2", (2, 2, 2))])
def test_mesh_parsing(text, shape):
    assert parse_mesh(text) == shape


@pytest.mark.parametrize("text", ["", "2x", "0", "2x2x2x2", "two", "64x64", "4x8"])
def test_bad_mesh_is_rejected(text, capsys):
    with pytest.raises(SystemExit):
        main(["validate", "--op", "fma", "--mesh", text])
    assert "mesh must" in capsys.readouterr().err


def test_status_lists_active_rules(capsys):
    assert main(["status"]) == 0
    out = capsys.readouterr().out
    assert "aten._grouped_mm.default" in out and "ours" in out


def test_a_mesh_over_the_limit_is_refused_naming_the_limit(capsys):
    """`validate --mesh 64x64` (4096 simulated ranks) would run unbounded: it is refused, naming MAX_RANKS."""
    from dtensor_rules.cli.main import MAX_RANKS

    with pytest.raises(SystemExit) as e:
        main(["validate", "--op", "fma", "--mesh", "64x64"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"at most {MAX_RANKS} ranks" in err and "4096" in err
    assert parse_mesh("4x4") == (4, 4) and parse_mesh("2x2x4") == (2, 2, 4)  # the limit itself is accepted


def test_every_subcommand_help_has_a_description(capsys):
    parser = build_parser()
    (subparsers,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert set(subparsers.choices) == {"demo", "validate", "status", "coverage"}
    for name, sub in subparsers.choices.items():
        assert sub.description and len(sub.description) > 60, name
        with pytest.raises(SystemExit):
            parser.parse_args([name, "--help"])
        assert " ".join(sub.description.split()[:6]) in " ".join(capsys.readouterr().out.split()), name


def test_validate_verbose_gives_each_missing_layout_its_reason(capsys):
    """`validate -v` gives every "ours missing" layout the reason our rule does not offer it."""
    assert main(["validate", "--op", "cumsum", "--mesh", "2", "-v"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "ours missing:" in ln]
    assert lines  # cumsum leaves out P(sum) where an integer input is promoted (DTensor's int sums wrap)
    for ln in lines:
        assert "(sample " in ln and "not offered: " in ln and ("upstream offers it" in ln or "upstream does not" in ln), ln
    assert any("int32[" in ln and "P(sum)" in ln for ln in lines)


def test_missing_reason_says_what_the_rule_offers_instead():
    from torch.distributed.tensor import Partial, Replicate, Shard

    from dtensor_rules.testing.validator import missing_reason

    s0, r, p = (Shard(0),), (Replicate(),), (Partial(),)
    combo = ((s0,), (p,))
    assert missing_reason(combo, {((s0,), (s0,)), ((s0,), (r,)), ((r,), (p,))}, None, "upstream", {combo}) == (
        "not offered: for these inputs the rule outputs (R), (S(0)); upstream offers it")
    assert missing_reason(combo, {((r,), (p,))}, None, "upstream", set()) == (
        "not offered: the rule has no strategy taking these inputs (DTensor redistributes them first); "
        "upstream does not offer it either")
    assert missing_reason(combo, set(), "RuntimeError: boom", "ours", None) == (
        "not offered: the rule raised RuntimeError: boom; ours has no rule")


def _fake_run_sh(tmp_path) -> tuple[dict, "Path"]:
    """run.sh, setup.py and the constraints in ``tmp_path`` with a fake python (venv, pip, pytest stand-ins)."""
    for name in ("run.sh", "setup.py", "constraints.txt", "constraints-2.14.txt"):
        shutil.copy(ROOT / name, tmp_path / name)
    fake = tmp_path / "fakepy"
    fake.write_text(
        "#!/bin/sh\n"
        'if [ "$1 $2" = "-m venv" ]; then mkdir -p "$3/bin" && cp "$0" "$3/bin/python"; exit 0; fi\n'
        'if [ "$1 $2" = "-m pip" ]; then echo "$*" >> "$(dirname "$0")/../pip.log"; exit 0; fi\n'
        'echo "ran $*"\n'
    )
    fake.chmod(0o755)
    env = {**os.environ, "PYTHON": str(fake)}
    for var in ("EXTRAS", "TORCH_VERSION", "HYPOTHESIS_PROFILE"):
        env.pop(var, None)
    return env, tmp_path / ".venv" / "pip.log"


def test_run_sh_says_it_is_installing_before_the_long_first_install(tmp_path):
    """The first `./run.sh` installs torch for minutes: it says so before it starts. A fake python
    stands in for venv and pip, so this runs run.sh's real logic in milliseconds."""
    env, log = _fake_run_sh(tmp_path)

    def run() -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "run.sh", "status"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)

    first = run()
    assert first.returncode == 0 and first.stdout == "ran -m dtensor_rules status\n", first.stderr
    assert first.stderr == "run.sh: installing dtensor_rules with torch 2.13.0 into .venv (first run, about 2-3 minutes)...\n"
    assert log.read_text().count("pip install") == 1
    second = run()  # installed: no message, no pip
    assert second.returncode == 0 and second.stderr == "" and second.stdout == first.stdout
    assert log.read_text().count("pip install") == 1


def test_validate_says_when_no_sharded_layout_is_valid(capsys):
    """0 valid combos is named, with the layouts tried, never a bare "incorrect 0, missing 0"."""
    assert main(["validate", "--op", "moe_permute_indices", "--mesh", "2"]) == 0
    out = capsys.readouterr().out
    assert ": 0 valid combos" in out and "note: no sharded layout is valid on these samples (" in out
    assert "(0 tried)" not in out


def test_run_sh_test_installs_the_extras_ci_uses(tmp_path):
    """`./run.sh test` installs what .ci/run sets (EXTRAS=test,triton,solver,torchtitan), so no test skips
    for a missing extra; an explicit EXTRAS still wins (.ci/run sets it itself)."""
    env, log = _fake_run_sh(tmp_path)
    ci_extras = re.search(r"EXTRAS=([\w,]+)", (ROOT / ".ci" / "run").read_text()).group(1)
    run = subprocess.run(["bash", "run.sh", "test", "-x"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout == "ran -m pytest -n 2 -q -x\n", run.stderr
    assert f'-e .[{ci_extras}]' in log.read_text() and "-c constraints.txt" in log.read_text()
    assert f"installing dtensor_rules[{ci_extras}] with torch 2.13.0" in run.stderr

    light = tmp_path / "light"
    light.mkdir()
    env, log = _fake_run_sh(light)
    run = subprocess.run(["bash", "run.sh", "test"], cwd=light, env={**env, "EXTRAS": "test"}, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0 and "-e .[test]" in log.read_text()
    run = subprocess.run(["bash", "run.sh", "status"], cwd=light, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and log.read_text().count("pip install") == 1  # status wants no extra: no pip run

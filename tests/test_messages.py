"""What the package tells a person, checked word for word where the wording is the point: the CLI's
help and refusals, the validator's explanations of what a rule leaves out, run.sh's first-install line.

The behaviour behind each message (exit codes, the JSON contract, what is validated) is tested in
tests/test_cli.py and the rule tests; here the text is what must stay readable and name the fix.
"""

from __future__ import annotations

import argparse
import subprocess

import pytest

from dtensor_rules.cli.main import build_parser, main, parse_mesh
from tests._fake_run_sh import fake_run_sh


def test_unknown_op_is_a_clear_error(capsys):
    assert main(["validate", "--op", "no_such_op"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown op 'no_such_op'") and "--import MODULE" in err


@pytest.mark.parametrize("text", ["", "2x", "0", "2x2x2x2", "two", "64x64", "4x8"])
def test_bad_mesh_is_rejected(text, capsys):
    with pytest.raises(SystemExit):
        main(["validate", "--op", "fma", "--mesh", text])
    assert "mesh must" in capsys.readouterr().err


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


def test_run_sh_says_it_is_installing_before_the_long_first_install(tmp_path):
    """The first `./run.sh` installs torch for minutes: it says so before it starts. A fake python
    stands in for venv and pip, so this runs run.sh's real logic in milliseconds."""
    env, log = fake_run_sh(tmp_path)

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


@pytest.mark.parametrize("name", ["expert_parallel", "token_placements", "expert_param_bytes"])
def test_the_old_models_path_of_an_ep_name_says_where_it_is(name):
    from dtensor_rules import ep

    with pytest.raises(ImportError, match=f"from dtensor_rules.ep import {name}$"):
        exec(f"from dtensor_rules.models import {name}", {})
    assert callable(getattr(ep, name))  # the name it points to exists
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        exec("from dtensor_rules import models; models.no_such_name", {})

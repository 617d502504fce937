"""`validate --import MODULE --op NAME` checks a user's own rule (docs/writing_rules.md): the module is
imported, its register(...) call adds the rule, and the rule is run against plain torch on its samples."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from tests._fresh import ROOT, run_python

RULE_MODULE = '''
import torch
import dtensor_rules
from torch.distributed.tensor import Replicate, Shard


@torch.library.custom_op("mine::rowclamp", mutates_args=())
def rowclamp(x: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    return torch.minimum(x, hi.reshape(-1, *[1] * (x.ndim - 1)))


@rowclamp.register_fake
def _(x, hi):
    return torch.empty_like(x)


def samples():
    g = torch.Generator().manual_seed(0)
    return [((torch.randn(5, 3, generator=g), torch.randn(5, generator=g)), {{}})]


@dtensor_rules.register(rowclamp, flops=lambda x, hi: x.numel(), bytes=lambda x, hi: 2 * x.nbytes, samples=samples)
def rowclamp_strategy(op, args_meta, kwargs_meta):
    """S(0) S(0) S(0): a rank's rows meet their own bounds. {extra_doc}"""
    return [[Shard(0), Shard(0), Shard(0)]{extra_row}]
'''


def write_rule(folder: Path, wrong: bool) -> None:
    extra = dict(extra_doc="S(0) S(0) R is WRONG: a rank's rows meet the first rows' bounds",
                 extra_row=", [Shard(0), Shard(0), Replicate()]") if wrong else dict(extra_doc="", extra_row="")
    (folder / "myrules.py").write_text(RULE_MODULE.format(**extra))


def validate(cwd: Path, *args: str):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    env.pop("DTENSOR_RULES_NO_INSTALL", None)
    return run_python(module="dtensor_rules", args=["validate", *args], env=env, cwd=cwd)


@pytest.mark.slow  # a fresh process per run
def test_a_user_rule_is_validated_after_import(tmp_path):
    write_rule(tmp_path, wrong=False)
    run = validate(tmp_path, "--import", "myrules", "--op", "mine.rowclamp", "--mesh", "2", "--json")
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout)
    assert report["op"] == "mine.rowclamp.default"
    assert report["ours"]["correct"] >= 1 and report["ours"]["incorrect"] == 0  # S(0) S(0) S(0) checked right


@pytest.mark.slow
def test_a_wrong_user_rule_is_caught_and_a_file_path_works(tmp_path):
    write_rule(tmp_path, wrong=True)
    run = validate(ROOT, "--import", str(tmp_path / "myrules.py"), "--op", "rowclamp", "--mesh", "2", "--json")
    assert run.returncode == 1, run.stderr[-3000:]  # exit 1: our (the user's) rule offers an incorrect layout
    assert json.loads(run.stdout)["ours"]["incorrect"] >= 1


@pytest.mark.slow
def test_without_import_the_error_says_how(tmp_path):
    write_rule(tmp_path, wrong=False)
    run = validate(tmp_path, "--op", "mine.rowclamp")
    assert run.returncode == 2
    assert run.stderr.strip() == ("error: unknown op 'mine.rowclamp' (`python -m dtensor_rules status` lists the ops "
                                  "with rules; for a rule of your own, add --import MODULE (the module whose "
                                  "register(...) call defines it))")
    run = validate(tmp_path, "--import", "nosuch_rules", "--op", "mine.rowclamp")
    assert run.returncode == 2 and "--import nosuch_rules: no module named 'nosuch_rules'" in run.stderr
    assert "Traceback" not in run.stderr

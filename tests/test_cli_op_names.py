"""`validate --op` with a name it does not know: one line with the closest names and the --import hint,
answered from the shipped-name list without importing torch; the list covers every shipped rule."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import dtensor_rules  # noqa: F401  (registers the shipped rules)
from dtensor_rules.cli.main import main
from dtensor_rules.cli.op_names import accepted_names, spellings, unknown_op_message
from dtensor_rules.cli.shipped_op_names import SHIPPED_OP_NAMES
from tests._fresh import ROOT


def test_the_shipped_name_list_covers_every_spelling_of_every_shipped_rule():
    missing = accepted_names(shipped_only=True) - SHIPPED_OP_NAMES
    assert not missing, f"`validate` would refuse {sorted(missing)}: run `python -m dtensor_rules.cli.op_names`"


def test_the_list_holds_the_spellings_resolve_accepts():
    for name in ("cumsum", "aten.cumsum", "aten.cumsum.default", "fma", "prims.fma.default", "moe_permute_indices"):
        assert name in SHIPPED_OP_NAMES, name
    assert {"aten.cumsum", "cumsum", "aten::cumsum"} <= spellings("aten.cumsum.default")


@pytest.mark.parametrize("typo, meant", [("cumsun", "cumsum"), ("aten.scater_add", "aten.scatter_add"),
                                          ("moe_permute_indice", "moe_permute_indices")])
def test_a_typo_gets_did_you_mean_and_the_import_hint(typo, meant, capsys):
    assert main(["validate", "--op", typo]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err  # one line
    assert err.startswith(f"error: unknown op {typo!r}; did you mean {meant!r}"), err
    assert "--import MODULE" in err


def test_a_name_far_from_every_op_gets_no_guess():
    line = unknown_op_message("zzzz_qqq", SHIPPED_OP_NAMES)
    assert "did you mean" not in line and line.startswith("unknown op 'zzzz_qqq' (")


def test_suggestions_name_each_op_once():
    line = unknown_op_message("mine.rowclam", {"mine.rowclamp", "mine.rowclamp.default", "rowclamp"})
    assert "did you mean 'mine.rowclamp'?" in line


@pytest.mark.slow  # a fresh interpreter: its imports are what is under test
def test_a_typo_is_answered_without_importing_torch():
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    run = subprocess.run([sys.executable, "-X", "importtime", "-m", "dtensor_rules", "validate", "--op", "cumsun"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    imported = {line.split("|")[-1].strip() for line in run.stderr.splitlines() if line.startswith("import time:")}
    assert "torch" not in imported and "dtensor_rules.cli.main" in imported
    assert "did you mean 'cumsum'" in run.stderr

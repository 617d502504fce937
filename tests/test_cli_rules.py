"""Every rule the package ships is listable (`status`) and checkable (`validate --op`) from the CLI,
including ``prims.fma`` before inductor is imported and the out= / in-place / hacked_twin overloads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import dtensor_rules  # noqa: F401  (registers the shipped rules)
from dtensor_rules import registry
from dtensor_rules.cli.resolve import resolve

ROOT = Path(__file__).resolve().parent.parent
FMA = "prims.fma.default"


def cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))  # this checkout, not an installed copy
    env.pop("DTENSOR_RULES_NO_INSTALL", None)
    return subprocess.run([sys.executable, "-m", "dtensor_rules", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)


def shipped() -> list[str]:
    names = {str(op) for op, rule in registry.rules().items() if registry.is_shipped(rule)}
    return sorted(names | set(registry.deferred()) | {FMA})


@pytest.mark.slow
def test_status_lists_every_shipped_rule_and_patch_before_inductor_is_imported() -> None:
    run = cli("status")
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr[-3000:]
    listed = {line.split()[0] for line in run.stdout.splitlines() if line[:1].isalpha()}
    missing = set(shipped()) - listed
    assert not missing, missing
    fma_line = next(line for line in run.stdout.splitlines() if line.startswith(FMA))
    assert "installs when torch._inductor.inductor_prims is imported" in fma_line
    for name in dtensor_rules.status().patches:
        assert any(line.startswith(name + " ") for line in run.stdout.splitlines()), name


# torchtitan's Triton and helion ops: CUDA kernels only, so `validate` cannot run them on a CPU
# machine; tests/test_torchtitan_ops.py checks them with CPU reference kernels (helion's: its own
# kernels in helion's eager reference mode)
CUDA_ONLY = {"torchtitan.silu_and_mul.default", "torchtitan.silu_and_mul_backward.default",
             "torchtitan.fused_mla_k_rope.default", "torchtitan.fused_mla_kv_backward.default",
             "torchtitan.fused_mla_q_rope_.default",
             *(f"torchtitan.helion_{k}_rope_{d}.default" for k in ("cossin", "complex") for d in ("fwd", "bwd"))}


# the EP token moves: collectives over a process group named in their arguments, which validate's
# simulated ranks do not have; tests/test_ep_compile.py checks their rule on real gloo ranks
COLLECTIVES = {"dtensor_rules.ep_dispatch.default", "dtensor_rules.ep_combine.default"}
# the routed-experts op: its expert-parallel row is a solver's choice that runs through
# expert_parallel (the kernel refuses experts split by expert), so a ground-truth sweep over every
# row cannot run it; tests/test_routed_experts_op.py checks each other row against one device
SOLVER_ONLY_ROWS = {"dtensor_rules.routed_experts.default", "dtensor_rules.routed_experts_backward.default"}


@pytest.mark.parametrize("name", shipped())
def test_validate_resolves_every_shipped_rule(name: str) -> None:
    if name in COLLECTIVES | SOLVER_ONLY_ROWS:  # validate says why it cannot run them
        with pytest.raises(KeyError, match="no suite it accepts calls from"):
            resolve(name)
        return
    if name.startswith("torchtitan."):
        from tests._torchtitan import require_torchtitan

        require_torchtitan("torchtitan.ops.scatter_add")
    op, samples, how = resolve(name)  # what `validate --op NAME` runs on (cheap: no validation here)
    assert str(op) == name and samples, (name, how)
    if name in CUDA_ONLY:
        return
    for args, kwargs in samples[:1]:  # a sample is a call the op accepts
        clone = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        op(*clone, **{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()})


@pytest.mark.parametrize("spelling", ["fma", "prims.fma", "prims::fma", FMA])
def test_fma_spellings_resolve(spelling: str) -> None:
    assert str(resolve(spelling).op) == FMA


@pytest.mark.slow
def test_validate_fma_from_a_fresh_process() -> None:
    run = cli("validate", "--op", "fma", "--json")  # the example in `validate --help`
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout)
    assert report["op"] == FMA and report["ours"]["incorrect"] == 0 and report["ours"]["correct"] > 0

"""DTensor rules for torchtitan's custom ops (``dtensor_rules.op_rules.torchtitan_ops``).

- registration: before torchtitan is imported ``status()`` lists the rules as deferred (a fresh
  interpreter); importing the defining module registers and installs them;
- every rule against ground truth with the validator (every input layout on every simulated rank:
  no incorrect row, no valid layout missing) on 1-D and 2-D meshes, fp32 and bf16;
- every rule through real DTensor dispatch against plain torch (the style of
  tests/test_rules_dispatch_oracle.py, which leaves these ops to this file): a Partial input, an
  uneven shard and any shard per sample, where the rule offers them.

``silu_and_mul``, its backward and the fused MLA rope ops are CUDA-only (Triton kernels); the fixture
gives them a CPU kernel for the test's duration (``fused_mla_q_rope_`` rotates q in place, as the
kernel does, and its rule keeps q's placement for the result: checked through DTensor dispatch).
silu_and_mul's CPU kernel is plain torch with the kernel's semantics (float32 math, cast to the
input dtype, rows past ``offsets[-1]`` not computed: zero here, unwritten memory there). Those
rows are undefined, which the validator cannot express: on a sample with offsets it checks that
every layout we offer is correct, not that no valid one is missing (with zeros standing in for
"undefined", a Partial(max) offsets would look valid: every rank but one computes no row).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest
import torch

import dtensor_rules
from dtensor_rules import registry
from dtensor_rules.testing import check_rule, simulated_mesh
from dtensor_rules.testing.dispatch import layout_kinds, pick_layouts, sharded_call
from dtensor_rules.testing.simulate import Sample
from dtensor_rules.testing.tables import emitted
from tests._torchtitan import require_helion_rope, require_torchtitan
from tests._torchtitan_cpu_kernels import (fused_mla_k_rope_cpu, fused_mla_kv_backward_cpu, fused_mla_q_rope_cpu,
                                           helion_on_cpu, silu_and_mul_backward_cpu, silu_and_mul_cpu)

HELION_OPS = tuple(f"helion_{kind}_rope_{d}" for kind in ("cossin", "complex") for d in ("fwd", "bwd"))
OPS = ("deterministic_scatter_add", "silu_and_mul", "silu_and_mul_backward", "fused_mla_k_rope", "fused_mla_kv_backward",
       "fused_mla_q_rope_", *HELION_OPS)


@pytest.fixture(scope="module")
def titan_ops() -> Iterator[dict[str, torch._ops.OpOverload]]:
    """The ops, defined by torchtitan's modules; the CUDA-only ones get a CPU kernel until teardown."""
    require_torchtitan("torchtitan.ops.scatter_add")
    require_torchtitan("torchtitan.overrides.fused_swiglu")
    require_torchtitan("torchtitan.overrides.fused_mla")
    lib = torch.library.Library("torchtitan", "IMPL")
    lib.impl("fused_mla_k_rope", fused_mla_k_rope_cpu, "CPU")
    lib.impl("fused_mla_kv_backward", fused_mla_kv_backward_cpu, "CPU")
    lib.impl("fused_mla_q_rope_", fused_mla_q_rope_cpu, "CPU")
    lib.impl("silu_and_mul", silu_and_mul_cpu, "CPU")
    lib.impl("silu_and_mul_backward", silu_and_mul_backward_cpu, "CPU")
    restore = helion_on_cpu(lib)
    try:
        yield {name: getattr(torch.ops.torchtitan, name).default for name in OPS if hasattr(torch.ops.torchtitan, name)}
    finally:
        lib._destroy()
        restore()


def _op(titan_ops: dict, name: str) -> torch._ops.OpOverload:
    if name in HELION_OPS:
        require_helion_rope()  # a skip without helion (outside CI)
    return titan_ops[name]


def test_status_lists_the_rules_as_deferred_until_torchtitan_defines_the_ops() -> None:
    require_torchtitan("torchtitan.ops.scatter_add")
    code = textwrap.dedent("""
        import sys, torch, dtensor_rules
        from dtensor_rules import registry
        names = ["torchtitan.deterministic_scatter_add.default", "torchtitan.silu_and_mul.default"]
        before = dtensor_rules.status()
        assert all(n in before.deferred for n in names), before.deferred
        assert "waiting" in before.patches["torchtitan_rules"].state
        import torchtitan.ops.scatter_add
        op = torch.ops.torchtitan.deterministic_scatter_add.default
        after = dtensor_rules.status()
        assert after[op]["active"] == "ours", after[op]
        assert names[0] not in after.deferred and names[1] in after.deferred
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def _slow(name: str, mesh: tuple[int, ...]) -> bool:
    """The validator's slow cases: the MLA ops (4-D operands, every layout of 4 tensors), the helion
    ops (kernels in helion's eager reference mode) and silu_and_mul_backward on (2,) (3 samples x 5 tensors)."""
    return name.startswith(("fused_mla", "helion")) or (name, mesh) == ("silu_and_mul_backward", (2,))


def _fresh(args: tuple) -> tuple:
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


def _samples(op: torch._ops.OpOverload) -> list[Sample]:
    return [Sample(tuple(a), dict(k)) for a, k in registry.get_rule(op).samples()]


@pytest.mark.parametrize("name,mesh_shape", [
    pytest.param(name, mesh, marks=[pytest.mark.slow] if _slow(name, mesh) else [], id=f"{name}-{'x'.join(map(str, mesh))}")
    # not the helion ops: helion's reference mode runs each kernel call eagerly, and the validator's
    # every-layout sweep costs minutes per op — they are proven
    # through real dispatch below (2x2: Partial, uneven and sharded layouts, both samples) instead
    for name in OPS if name not in HELION_OPS for mesh in [(2,), (2, 2)]
])
def test_rule_matches_ground_truth(titan_ops: dict, name: str, mesh_shape: tuple[int, ...]) -> None:
    """The validator runs the op on every simulated rank for every input layout: our rows are all
    correct, and no layout that ground truth accepts is missing (bf16 and offsets samples included;
    every sample on the 1-D mesh, the first on 2x2, where a sample costs ~3 s)."""
    op = _op(titan_ops, name)
    assert registry.get_rule(op).module == "dtensor_rules.op_rules.torchtitan_ops"
    for sample in _samples(op)[: 1 if len(mesh_shape) > 1 else None]:
        report = check_rule(op, sample.args, sample.kwargs, mesh_shape)
        has_offsets = name != "deterministic_scatter_add" and len(sample.tensors()) > (3 if "backward" in name else 2)
        report.check(complete=not has_offsets)


@pytest.mark.parametrize("name", OPS)
def test_rule_through_dtensor_dispatch_matches_one_device(titan_ops: dict, name: str) -> None:
    """Real DTensor dispatch (our installed rule picks the strategy) on a simulated 2x2 mesh."""
    op = _op(titan_ops, name)
    mesh_shape = (2, 2)
    seen: set[str] = set()
    with registry.installed("override", ops=[op]), simulated_mesh(mesh_shape) as mesh:
        for i, sample in enumerate(_samples(op)):
            for pick in pick_layouts(emitted(op, sample.args, sample.kwargs, mesh_shape), sample.tensors(), mesh_shape, i):
                want = op(*_fresh(sample.args), **sample.kwargs)  # fused_mla_q_rope_ writes into q
                got = sharded_call(op, sample, mesh, pick[0])
                got_t, want_t = (got, want) if isinstance(want, tuple) else ((got,), (want,))
                for gt, w in zip(got_t, want_t):
                    tol = {"atol": 0.1, "rtol": 0.05} if w.dtype == torch.bfloat16 else {}
                    assert gt.dtype == w.dtype
                    torch.testing.assert_close(gt, w, **tol, msg=lambda m: f"{op} {pick}: {m}")
                seen |= layout_kinds(pick[0], sample.tensors(), mesh_shape)
    assert {"partial", "uneven", "shard"} <= seen, seen


def test_costs_price_the_ops(titan_ops: dict) -> None:
    """Cost formulas through the package's estimator: scatter_add's at dim 0; silu ops elementwise."""
    from dtensor_rules.costs import estimate

    for name, op in titan_ops.items():
        for sample in _samples(op):
            cost = estimate(op, *sample.args, **sample.kwargs)
            assert cost.flops > 0 and cost.bytes_read > 0 and cost.bytes_written > 0, (name, cost)
    out, index, src = _samples(titan_ops["deterministic_scatter_add"])[0].args
    via_aten = estimate(torch.ops.aten.scatter_add.default, out, 0, index, src)
    assert estimate(titan_ops["deterministic_scatter_add"], out, index, src) == via_aten
    assert dtensor_rules.status()[titan_ops["silu_and_mul"]]["active"] == "ours"


def test_q_rope_in_place_on_dtensors_returns_q_with_its_placements(titan_ops: dict) -> None:
    """The in-place op on a DTensor q: the result is q itself (same object, same placements), its
    values the one-device rotation; every layout the rule offers for q is one DTensor accepts."""
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    op = titan_ops["fused_mla_q_rope_"]
    q, cache, pos, nope, inverse = _samples(op)[0].args
    want = op(q.clone(), cache, pos, nope, inverse)
    torch.testing.assert_close(op(want.clone(), cache, pos, nope, not inverse), q)  # the backward undoes it
    layouts = [((Shard(0), Shard(2)), (Shard(0), Replicate())), ((Shard(1), Replicate()), (Shard(1), Replicate())),
               ((Shard(2), Shard(0)), (Replicate(), Shard(0))), ((Partial("sum"), Shard(1)), (Replicate(), Shard(1)))]
    with registry.installed("override", ops=[op]), simulated_mesh((2, 2)) as mesh:
        for q_pl, pos_pl in layouts:
            plain = [Replicate() if isinstance(p, Partial) else p for p in q_pl]
            qd = distribute_tensor(q.clone(), mesh, plain)
            if plain != list(q_pl):  # Partial(sum) on a 2-rank dim: half of the value on each rank
                qd = DTensor.from_local(qd.to_local() / 2, mesh, q_pl, shape=qd.shape, stride=qd.stride())
            out = op(qd, distribute_tensor(cache, mesh, [Replicate()] * 2), distribute_tensor(pos, mesh, pos_pl),
                     nope, inverse)
            assert out is qd and tuple(out.placements) == q_pl, (q_pl, out.placements)
            torch.testing.assert_close(out.full_tensor(), want, msg=lambda m: f"{q_pl}: {m}")

"""Every shipped rule through real DTensor dispatch, against plain torch on the full tensors.

Not our validator: DTensors on a simulated 2x2 mesh, the op called on them (our installed rule
picks the strategy, DTensor redistributes and runs the local kernel on every rank), the result
gathered and compared with the op on one device. Input layouts are the rule's own rows for the
sample (``emitted``), so what runs is what the rule claims: per sample, one with a Partial input,
one with an uneven shard and one with any shard, where the rule offers them. Samples are the
rule's suite; an out= / in-place / hacked-twin overload without one takes its functional
overload's samples (``aliased_sample``). A guard fails when a shipped op has no case here.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.distributed.tensor.placement_types import Partial, Replicate, Shard

import dtensor_rules  # noqa: F401  (installs the rules)
from dtensor_rules import registry
from dtensor_rules.op_rules.fma import fma  # noqa: F401  (defines prims.fma, which registers its rule)
from dtensor_rules.testing import simulated_mesh
from dtensor_rules.testing.aliasing import _written_args, aliased_sample, aliasing, functional_counterpart, with_sized_outs
from dtensor_rules.testing.dispatch import pick_layouts, sharded_call
from dtensor_rules.testing.simulate import Sample
from dtensor_rules.testing.tables import emitted

aten = torch.ops.aten
MESH = (2, 2)
SAMPLES_PER_OP = 2


# torchtitan's ops register when another test imports torchtitan (so not at a fixed time here) and
# two of them have no CPU kernel: tests/test_torchtitan_ops.py runs their dispatch cases; the EP token
# moves are collectives over a named process group: tests/test_ep_compile.py runs them on gloo ranks;
# the routed-experts op's expert-parallel row runs only through expert_parallel:
# tests/test_routed_experts_op.py runs every other row through dispatch against one device
ELSEWHERE = ("dtensor_rules.op_rules.torchtitan_ops", "dtensor_rules.ep.all_to_all_rule", "dtensor_rules.ep.routed_experts_rule")


def _shipped() -> list[torch._ops.OpOverload]:
    """The ops the package registers (not the custom ops other tests register for a while)."""
    return sorted((op for op, r in registry.rules().items()
                   if r.module.startswith("dtensor_rules.op_rules") and r.module not in ELSEWHERE), key=str)


SHIPPED = _shipped()
# overloads with neither a suite nor an out=/in-place counterpart: the suite of the call they equal
SUITE_OF = {
    aten.index.Tensor_hacked_twin: aten.index.Tensor,
    aten.index_put.hacked_twin: aten.index_put.default,
    aten._index_put_impl.default: aten.index_put.default,
}
# CompositeImplicitAutograd in torch: decomposed (argsort -> sort) before DTensor's dispatch sees the
# op, so no rule for them is ever consulted at dispatch (the solver queries still read ours); the
# call through DTensor is still checked. argsort.stable_out's decomposition writes into a plain
# tensor it allocates, which DTensor refuses, with or without this package.
DECOMPOSED = {aten.argsort.default, aten.argsort.stable, aten.argsort.stable_out}
FAILS_UPSTREAM = {aten.argsort.stable_out: "mixed torch.Tensor and DTensor"}


def _clone(sample: Sample) -> tuple[tuple, dict]:
    return sample.replace_tensors([t.clone() for t in sample.tensors()])


def _samples(op: torch._ops.OpOverload) -> list[Sample]:
    """Up to ``SAMPLES_PER_OP`` calls of ``op`` single-device torch accepts."""
    rule = registry.get_rule(op)
    if rule.samples is not None:
        source, func = rule.samples, op
    else:
        func = functional_counterpart(op) or op
        source = registry.get_rule(SUITE_OF.get(func, func)).samples
    out = []
    for args, kwargs in source():
        if func is not op:
            args, kwargs = aliased_sample(op, args, kwargs)
        if op in SUITE_OF:  # hacked twins take a plain list of index tensors
            args = tuple(list(a) if isinstance(a, (list, tuple)) else a for a in args)
        sample = with_sized_outs(op, Sample(tuple(args), dict(kwargs)))
        try:
            op(*(_clone(sample)[0]), **_clone(sample)[1])
        except (RuntimeError, TypeError, IndexError):
            continue  # e.g. a None index a hacked twin does not take, an in-place dtype change
        out.append(sample)
        if len(out) == SAMPLES_PER_OP:
            break
    return out


def _redistributed(op: torch._ops.OpOverload, sample: Sample) -> list[tuple]:
    """For a rule that offers only all-Replicate (moe_permute_indices): sharded and Partial inputs,
    which dispatch must redistribute to the rule's layout first (an out= tensor stays Replicate:
    it is never redistributed, it takes the output's layout)."""
    outs = aliasing(op, sample).out

    def layout(i: int, t: torch.Tensor) -> tuple:
        movable = t.ndim and t.dtype != torch.bool and i not in outs
        return (Shard(0), Partial("sum")) if movable else (Replicate(), Replicate())

    return [(tuple(layout(i, t) for i, t in enumerate(sample.tensors())), None)]


def _assert_same(got: Any, want: Any, what: str) -> None:
    got_t = got if isinstance(got, (tuple, list)) else (got,)
    want_t = want if isinstance(want, (tuple, list)) else (want,)
    assert len(got_t) == len(want_t), what
    for g, w in zip(got_t, want_t):
        tol = {"atol": 0.1, "rtol": 0.05} if w.dtype in (torch.bfloat16, torch.float16) else {}
        assert g.dtype == w.dtype, f"{what}: dtype {g.dtype} != {w.dtype}"
        torch.testing.assert_close(g, w, **tol, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("op", SHIPPED, ids=str)
def test_rule_through_dtensor_dispatch_matches_one_device(op: torch._ops.OpOverload) -> None:
    """Ours is the active rule for the case (``override``: where the measured policy keeps upstream's,
    e.g. ``_index_put_impl_``, ours still has to hold through dispatch); restored after."""
    samples = _samples(op)
    assert samples, f"no sample of {op} (or of its functional overload) is accepted by {op}"
    ran = 0
    with registry.installed("override", ops=[op]), simulated_mesh(MESH) as mesh:
        if op in FAILS_UPSTREAM:
            with pytest.raises(RuntimeError, match=FAILS_UPSTREAM[op]):
                sharded_call(op, samples[0], mesh, [(Shard(0), Shard(0))] * len(samples[0].tensors()))
            return
        cases = [(s, c) for i, s in enumerate(samples) for c in pick_layouts(emitted(op, s.args, s.kwargs, MESH), s.tensors(), MESH, seed=i)]
        for sample, (ins, outs) in cases or [(samples[0], c) for c in _redistributed(op, samples[0])]:
            want = op(*_clone(sample)[0], **_clone(sample)[1])
            got = sharded_call(op, sample, mesh, ins)
            _assert_same(got, want, f"{op} on {[tuple(t.shape) for t in sample.tensors()]} with inputs {ins} (rule says {outs})")
            ran += 1
    assert ran > 0, f"{op}: no sample ran"


def test_decomposed_ops_are_the_ones_torch_decomposes() -> None:
    """If torch stops decomposing one of them, its rule becomes reachable: drop it from the sets."""
    def decomposed(op: torch._ops.OpOverload) -> bool:
        try:
            return op.has_kernel_for_dispatch_key(torch._C.DispatchKey.CompositeImplicitAutograd)
        except RuntimeError:  # the hacked twins are not in the dispatcher's table (torch resolves them itself)
            return False

    assert {op for op in SHIPPED if decomposed(op)} == DECOMPOSED


def test_every_shipped_rule_has_a_dispatch_case() -> None:
    """The cases above are the registry's shipped set (prims.fma included, whose
    rule registers once inductor defines the op): a rule added later, or in a new module, gets a
    case or this fails; each case fails unless a sharded or Partial layout ran."""
    assert set(SHIPPED) == set(_shipped())
    assert {aten.cumsum.out, aten.index.Tensor_hacked_twin, torch.ops.prims.fma.default} <= set(SHIPPED)
    assert sum(1 for op in SHIPPED if _written_args(op)) >= 20  # the out= / in-place overloads too

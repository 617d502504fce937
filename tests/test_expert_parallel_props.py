"""Property tests of the expert-parallel dispatch/experts/combine against a single-device oracle.

Simulated meshes (every rank in this process, ``LocalTensorMode``, whose functional
all-to-all takes per-rank split sizes) make each example cheap; the real-gloo proof is
``tests/test_expert_parallel.py``. Hypothesis draws the mesh, the experts per rank, top-k,
the token count (fewer tokens than ranks included), the alignment and a routing skew
(none, one hot expert, one dead expert).
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

# private torch internals used here, in one block (LocalTensor: build per-rank counts by hand)
from torch.distributed._local_tensor import LocalTensor

import dtensor_rules  # noqa: F401
from dtensor_rules.ep import expert_parallel, token_placements
from dtensor_rules.models import MoE, MoEConfig
from dtensor_rules.ep.local import exchange_counts
from dtensor_rules.testing import simulated_mesh


def _copies(t: torch.Tensor) -> list[torch.Tensor]:
    local = getattr(t, "_local_tensors", None)
    return [local[r] for r in sorted(local)] if local is not None else [t]


@st.composite
def ep_cases(draw: st.DrawFn) -> dict:
    mesh = draw(st.sampled_from([(1,), (2,), (4,), (2, 2)]))
    per_rank = draw(st.integers(1, 2))
    E = mesh[0] * per_rank
    return {
        "mesh": mesh,
        "E": E,
        "k": draw(st.integers(1, min(3, E))),
        "T": draw(st.integers(1, 9)),
        "alignment": draw(st.sampled_from([1, 3, 8])),
        "skew": draw(st.sampled_from(["none", "hot", "dead"])),
        "seed": draw(st.integers(0, 2**16)),
    }


def _model(case: dict) -> MoE:
    E = case["E"]
    model = MoE(MoEConfig(dim=8, hidden=16, n_experts=E, top_k=case["k"], alignment=case["alignment"]))
    model.init_weights(case["seed"])
    if case["skew"] != "none":
        bias = torch.zeros(E)
        bias[case["seed"] % E] = 10.0 if case["skew"] == "hot" else -10.0
        model.expert_bias.copy_(bias)
    return model


@given(ep_cases())
def test_expert_parallel_equals_single_device(case: dict) -> None:
    model = _model(case)
    g = torch.Generator().manual_seed(case["seed"])
    x = torch.randn(case["T"], 8, generator=g)
    cot = torch.randn(case["T"], 8, generator=g)
    xr = x.clone().requires_grad_()
    out = model(xr)
    names = [n for n, _ in model.named_parameters()]
    want = [out.detach(), *torch.autograd.grad((out * cot).sum(), [xr, *model.parameters()])]

    names_mesh = ("ep", "tp")[: len(case["mesh"])]
    tp = "tp" if len(case["mesh"]) == 2 else None
    with simulated_mesh(case["mesh"], names=names_mesh) as mesh:
        ep_model = expert_parallel(copy.deepcopy(model), mesh, tp_dim=tp)
        place = token_placements(mesh, tp_dim=tp)
        from torch.distributed.tensor import distribute_tensor

        xd = distribute_tensor(x, mesh, place).requires_grad_()
        outd = ep_model(xd)
        grads = torch.autograd.grad((outd * distribute_tensor(cot, mesh, place)).sum(), [xd, *ep_model.parameters()])
        got = [outd.full_tensor(), *(t.full_tensor() for t in grads)]
    for name, gt, w in zip(["output", "grad x", *names], got, want):
        for c in _copies(gt):
            torch.testing.assert_close(c, w, atol=1e-5, rtol=1e-5, msg=lambda m: f"{name} {case}: {m}")


@given(ep=st.sampled_from([1, 2, 4]), per_rank=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_count_exchange_is_a_transpose(ep: int, per_rank: int, seed: int) -> None:
    """The one small all-to-all: rank r's entry s*E_l+e is what rank s counted for r's local expert e."""
    E = ep * per_rank
    counts = torch.randint(0, 5, (ep, E), generator=torch.Generator().manual_seed(seed))
    with simulated_mesh((ep,), names=("ep",)) as mesh:
        local = LocalTensor({r: counts[r].clone() for r in range(ep)})
        got = exchange_counts(local, mesh.get_group("ep"))
        per = {r: got._local_tensors[r] for r in range(ep)}
    for r in range(ep):
        want = counts[:, r * per_rank:(r + 1) * per_rank].reshape(-1)
        assert torch.equal(per[r], want), (r, per[r], want)


def test_bad_mesh_and_sizes_name_the_fix() -> None:
    model = MoE(MoEConfig(dim=8, hidden=16, n_experts=4, top_k=2))
    with simulated_mesh((3,), names=("ep",)) as mesh, pytest.raises(ValueError, match=r"n_experts=4 .* 'ep' mesh size 3"):
        expert_parallel(copy.deepcopy(model), mesh, tp_dim=None)
    with simulated_mesh((2, 3), names=("ep", "tp")) as mesh, pytest.raises(ValueError, match=r"hidden=16 .* 'tp' mesh size 3"):
        expert_parallel(copy.deepcopy(model), mesh)
    with simulated_mesh((2, 2), names=("dp", "ep")) as mesh, pytest.raises(ValueError, match="fully_shard"):
        expert_parallel(copy.deepcopy(model), mesh)
    assert math.prod((2, 2)) == 4




@settings(phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(ep=st.sampled_from([2, 4]), T=st.integers(1, 12), k=st.integers(1, 2), seed=st.integers(0, 2**16))
def test_byte_formulas_match_what_one_step_measures(ep: int, T: int, k: int, seed: int) -> None:
    """``ep_step_cost`` bytes against ``CommBytesMode`` (rank 0) for one forward; no shrinking (slow here)."""
    from torch.distributed.tensor import distribute_tensor

    from dtensor_rules.ep.costs import ep_step_cost
    from dtensor_rules.testing.comm import CommBytesMode

    E, D, H = 2 * ep, 8, 16
    model = MoE(MoEConfig(dim=D, hidden=H, n_experts=E, top_k=k, alignment=4))
    model.init_weights(seed)
    x = torch.randn(T, D, generator=torch.Generator().manual_seed(seed))
    idx, _ = model.route(x)  # the gate is replicated: the sharded run routes every token the same way
    sent = len(range(T)[: -(-T // ep)]) * k  # Shard(0): rank 0 holds the first ceil(T / ep) tokens
    received = int((idx < E // ep).sum())  # rank 0 owns experts [0, E / ep)
    with simulated_mesh((ep,), names=("ep",)) as mesh:
        ep_model = expert_parallel(model, mesh, tp_dim=None)
        xd = distribute_tensor(x, mesh, token_placements(mesh, tp_dim=None))
        with CommBytesMode() as comm:
            ep_model(xd)
    want = ep_step_cost(E, sent, received, 0, D, H, 4)
    assert comm.bytes["forward"]["all_to_all"] == want.count_bytes + want.token_bytes, (comm.bytes, want)


def test_flop_formula_matches_flop_counter() -> None:
    """``ep_step_cost`` expert flops against FlopCounterMode (the package's _grouped_mm formula) on one rank's experts."""
    from torch.utils.flop_counter import FlopCounterMode

    from dtensor_rules.ep.costs import ep_step_cost
    from dtensor_rules.ep.local import local_experts

    E_l, D, H = 3, 8, 16
    offs = torch.tensor([8, 8, 24], dtype=torch.int32)  # an empty middle expert; 24 padded rows
    g = torch.Generator().manual_seed(0)
    w1, w3, w2 = torch.randn(E_l, D, H, generator=g), torch.randn(E_l, D, H, generator=g), torch.randn(E_l, H, D, generator=g)
    with FlopCounterMode(display=False) as flops:
        local_experts(torch.randn(30, D, generator=g), offs, w1, w3, w2)
    got = flops.get_flop_counts()["Global"][torch.ops.aten._grouped_mm]
    assert got == ep_step_cost(3 * E_l, 0, 0, 24, D, H, 4).expert_flops == 6 * 24 * D * H

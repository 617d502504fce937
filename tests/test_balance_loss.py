"""The optional auxiliary load-balancing loss (``MoEConfig.balance_loss``) against the paper's formulas.

torchtitan 0.3.0 has no such loss (only the auxiliary-loss-free bias update,
tests/test_router_parity.py), so the oracle is :func:`paper_loss` below, written from DeepSeek-V3
(arXiv 2412.19437) eq. 17-20 with Python loops over sequences, tokens and experts (not from
``routing.balance_loss``): per sequence of S tokens, ``f_i = E/(k S) * #{t: i in TopK(s_t + b)}``,
``P_i = 1/S sum_t s_{i,t} / sum_j s_{j,t}``, ``L = alpha sum_i f_i P_i``, averaged over sequences;
the switch-style batch loss is the same over the whole batch as one sequence.

- one device: the loss and its gradient to the router gate equal the oracle's; the experts get none;
- a simulated ep (and ep x tp) mesh with token-sharded inputs: the loss is the global one (equal to
  one device's, and for the batch loss unequal to the mean of per-rank losses), and so is the
  gate's gradient.
"""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dtensor_rules.ep import expert_parallel, token_placements
from dtensor_rules.models import MoE, MoEConfig
from dtensor_rules.models.routing import balance_loss
from dtensor_rules.testing import simulated_mesh

D = 8


def paper_loss(s: torch.Tensor, bias: torch.Tensor, k: int, alpha: float, seq_len: int) -> torch.Tensor:
    """DeepSeek-V3 eq. 17-20 for (T, E) affinities ``s``, one sequence per ``seq_len`` tokens, averaged."""
    T, E = s.shape
    losses = []
    for start in range(0, T, seq_len):
        seq = s[start:start + seq_len]
        n = seq.shape[0]
        f = [0.0] * E
        P = [seq.new_zeros(()) for _ in range(E)]
        for t in range(n):
            ranked = sorted(range(E), key=lambda j: float(seq[t, j].detach() + bias[j]), reverse=True)
            for i in ranked[:k]:
                f[i] += E / (k * n)
            total = sum(seq[t, j] for j in range(E))
            for i in range(E):
                P[i] = P[i] + seq[t, i] / total / n
        losses.append(alpha * sum(f[i] * P[i] for i in range(E)))
    return sum(losses) / len(losses)


def affinities(x: torch.Tensor, gate: torch.Tensor, score_func: str) -> torch.Tensor:
    """s_{i,t}: eq. 15 (sigmoid) or a softmax over the experts, of the token-to-expert logits."""
    logits = x.reshape(-1, D).float() @ gate.t()
    return torch.sigmoid(logits) if score_func == "sigmoid" else torch.softmax(logits, dim=-1)


@st.composite
def loss_cases(draw: st.DrawFn) -> dict:
    return {
        "mode": draw(st.sampled_from(["sequence", "batch"])),
        "score_func": draw(st.sampled_from(["sigmoid", "softmax"])),
        "E": draw(st.sampled_from([2, 4, 8])),
        "k": draw(st.integers(1, 2)),
        "B": draw(st.integers(1, 3)),
        "S": draw(st.integers(1, 5)),
        "bias": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**16)),
    }


@given(loss_cases())
def test_loss_and_router_gradient_equal_the_papers_formulas(case: dict) -> None:
    model = MoE(MoEConfig(dim=D, hidden=8, n_experts=case["E"], top_k=case["k"], score_func=case["score_func"],
                          expert_bias=case["bias"], balance_loss=case["mode"], balance_alpha=0.3))
    model.init_weights(case["seed"])
    x = torch.randn(case["B"], case["S"], D, generator=torch.Generator().manual_seed(case["seed"]))
    model(x)
    gate = model.gate.detach().clone().requires_grad_()
    bias = model.expert_bias if case["bias"] else torch.zeros(case["E"])
    seq_len = case["S"] if case["mode"] == "sequence" else case["B"] * case["S"]
    want = paper_loss(affinities(x, gate, case["score_func"]), bias, case["k"], 0.3, seq_len)
    torch.testing.assert_close(model.aux_loss, want, atol=1e-6, rtol=1e-5)

    params = dict(model.named_parameters())
    grads = dict(zip(params, torch.autograd.grad(model.aux_loss, list(params.values()), allow_unused=True)))
    torch.testing.assert_close(grads.pop("gate"), torch.autograd.grad(want, gate)[0], atol=1e-6, rtol=1e-5)
    assert all(g is None for g in grads.values()), {n for n, g in grads.items() if g is not None}


def test_sequence_loss_reads_each_row_as_a_sequence_and_a_2d_input_as_one() -> None:
    model = MoE(MoEConfig(dim=D, n_experts=4, balance_loss="sequence", balance_alpha=1.0))
    x = torch.randn(3, 4, D, generator=torch.Generator().manual_seed(1))
    s = affinities(x, model.gate.detach(), "sigmoid")
    model(x)
    torch.testing.assert_close(model.aux_loss, paper_loss(s, model.expert_bias, 2, 1.0, 4))
    model(x.reshape(12, D))
    torch.testing.assert_close(model.aux_loss, paper_loss(s, model.expert_bias, 2, 1.0, 12))


def test_hand_worked_values() -> None:
    """At a perfect balance f_i = 1 and sum_i P_i = 1, so L = alpha whatever the scores; every token
    on the expert it favours, with P = (0.9, 0.1): f = (2, 0), L = alpha * 2 * 0.9."""
    two = torch.tensor([[0], [1]] * 3)
    assert balance_loss(torch.rand(6, 2, generator=torch.Generator().manual_seed(2)), two, 0.5).item() == \
        pytest.approx(0.5)
    skewed = torch.tensor([[0.9, 0.1]] * 6)
    assert balance_loss(skewed, torch.zeros(6, 1, dtype=torch.int64), 0.5).item() == pytest.approx(0.9)
    # per sequence of 3: the first sequence balanced (1.0 * alpha), the second collapsed (1.8 * alpha)
    idx = torch.tensor([[0], [1], [0], [0], [0], [0]])
    p = torch.tensor([[0.5, 0.5]] * 3 + [[0.9, 0.1]] * 3)
    want = (0.5 * (1.5 * 0.5 + 0.5 * 0.5) + 0.5 * 1.8) / 2  # f = (4/3, 2/3) on the uniform first one
    assert balance_loss(p, idx, 0.5, seq_len=3).item() == pytest.approx(want)
    with pytest.raises(ValueError, match="sequences of 4"):
        balance_loss(p, idx, 0.5, seq_len=4)


def test_off_by_default_and_the_forward_is_unchanged() -> None:
    assert MoEConfig().balance_loss is None
    x = torch.randn(5, D, generator=torch.Generator().manual_seed(3))
    off = MoE(MoEConfig(dim=D))
    on = MoE(MoEConfig(dim=D, balance_loss="batch"))
    out = off(x)
    assert off.aux_loss is None
    assert torch.equal(on(x), out) and on.aux_loss is not None
    with pytest.raises(ValueError, match="balance_loss='switch'"):
        MoEConfig(balance_loss="switch")


@pytest.mark.parametrize("mesh_shape", [(2,), (2, 2)])
@pytest.mark.parametrize("mode", ["sequence", "batch"])
def test_on_an_ep_mesh_the_loss_is_the_global_one(mesh_shape: tuple[int, ...], mode: str) -> None:
    """Tokens Shard(0) on ep: every rank's loss and the gate's gradient equal one device's."""
    from torch.distributed.tensor import distribute_tensor

    model = MoE(MoEConfig(dim=D, hidden=16, n_experts=4, top_k=2, balance_loss=mode, balance_alpha=0.5))
    model.init_weights(4)
    with torch.no_grad():
        model.expert_bias.copy_(torch.tensor([0.3, 0.0, 0.0, -0.3]))  # a skewed load
    x = torch.randn(4, 3, D, generator=torch.Generator().manual_seed(4))
    gate = model.gate.detach().clone().requires_grad_()
    s = affinities(x, gate, "sigmoid")
    want = paper_loss(s, model.expert_bias, 2, 0.5, 3 if mode == "sequence" else 12)
    want_grad = torch.autograd.grad(want, gate)[0]
    if mode == "batch":  # the two ep ranks' own losses: their mean is not the batch loss
        halves = [paper_loss(s[r * 6:(r + 1) * 6], model.expert_bias, 2, 0.5, 6) for r in range(2)]
        assert abs(float(sum(halves)) / 2 - float(want)) > 1e-3

    names = ("ep", "tp")[: len(mesh_shape)]
    tp = "tp" if len(mesh_shape) == 2 else None
    with simulated_mesh(mesh_shape, names=names) as mesh:
        ep_model = expert_parallel(copy.deepcopy(model), mesh, tp_dim=tp)
        ep_model(distribute_tensor(x, mesh, token_placements(mesh, tp_dim=tp)))
        got = ep_model.aux_loss.full_tensor()
        grad = torch.autograd.grad(ep_model.aux_loss, ep_model.gate)[0].full_tensor()
        for r in got._local_tensors.values():
            torch.testing.assert_close(r, want.detach(), atol=1e-6, rtol=1e-5)
        for r in grad._local_tensors.values():
            torch.testing.assert_close(r, want_grad, atol=1e-6, rtol=1e-5)

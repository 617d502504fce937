"""Our MoE router against torchtitan 0.3.0's own code on the same inputs (the oracle is torchtitan's).

- ``MoE.route`` vs ``TokenChoiceTopKRouter``: softmax and sigmoid scores, node-limited group
  routing, route norm and scale, with an expert bias: the same experts per token and the same
  weights (compared per token sorted by expert id: torchtitan's top-k is ``sorted=False``);
- ``routing.tokens_per_expert`` vs torchtitan's ``MoE.tokens_per_expert_E`` after a training forward;
- ``routing.expert_bias_delta`` vs torchtitan's optimizer pre-hook
  (``register_moe_load_balancing_hook``), run on a torchtitan MoE with those counts.

torchtitan 0.3.0 has no auxiliary load-balancing loss to compare with: the package's optional one is
checked against the paper's formulas in tests/test_balance_loss.py.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dtensor_rules.models import MoE, MoEConfig
from dtensor_rules.models.routing import expert_bias_delta, tokens_per_expert
from tests._torchtitan import require_torchtitan, torchtitan_moe

pytestmark = pytest.mark.filterwarnings("ignore:In CPU autocast, but the target dtype is not supported")

E, D = 8, 16


@st.composite
def router_cases(draw: st.DrawFn) -> dict:
    groups = draw(st.sampled_from([None, 2, 4]))
    return {
        "score_func": draw(st.sampled_from(["sigmoid", "softmax"])),
        "top_k": draw(st.integers(1, 3)),
        "route_norm": draw(st.booleans()),
        "route_scale": draw(st.sampled_from([1.0, 2.5])),
        "groups": groups,
        "limited": None if groups is None else draw(st.integers(1, groups)),
        "T": draw(st.integers(1, 12)),
        "seed": draw(st.integers(0, 2**16)),
    }


def _pair(case: dict) -> tuple[MoE, torch.nn.Module]:
    moe = require_torchtitan()
    from torchtitan.models.common.linear import Linear

    ours = MoE(MoEConfig(dim=D, hidden=8, n_experts=E, top_k=case["top_k"], route_norm=case["route_norm"],
                         route_scale=case["route_scale"], score_func=case["score_func"],
                         n_expert_groups=case["groups"], n_limited_groups=case["limited"]))
    ours.init_weights(case["seed"])
    theirs = moe.TokenChoiceTopKRouter.Config(
        num_experts=E, gate=Linear.Config(in_features=D, out_features=E), top_k=case["top_k"],
        score_func=case["score_func"], route_norm=case["route_norm"], route_scale=case["route_scale"],
        num_expert_groups=case["groups"], num_limited_groups=case["limited"]).build()
    with torch.no_grad():
        theirs.gate.weight.copy_(ours.gate)
    return ours, theirs


@pytest.mark.slow  # one torchtitan router built per example
@given(router_cases())
def test_route_equals_torchtitans_router(case: dict) -> None:
    ours, theirs = _pair(case)
    x = torch.randn(case["T"], D, generator=torch.Generator().manual_seed(case["seed"]))
    idx, weights = ours.route(x)
    t_scores, t_idx, _ = theirs(x.unsqueeze(0), ours.expert_bias)
    t_idx, t_scores = t_idx[0], t_scores[0]
    o_idx, o_order = idx.sort(dim=-1)
    o_w = weights.gather(-1, o_order)
    t_sorted, t_order = t_idx.sort(dim=-1)
    assert torch.equal(o_idx, t_sorted), (case, idx, t_idx)
    torch.testing.assert_close(o_w, t_scores.gather(-1, t_order), atol=1e-6, rtol=1e-6)


@given(seed=st.integers(0, 2**16), T=st.integers(1, 12), k=st.integers(1, 3))
def test_tokens_per_expert_and_bias_update_equal_torchtitans(seed: int, T: int, k: int) -> None:
    require_torchtitan()
    from torchtitan.components.optimizer.optimizer import register_moe_load_balancing_hook

    titan = torchtitan_moe(n_experts=E, top_k=k, score_func="sigmoid", seed=seed)
    titan.train()
    x = torch.randn(1, T, D, generator=torch.Generator().manual_seed(seed))
    bias_before = titan.expert_bias_E.clone()
    _, t_idx, _ = titan.router(x, titan.expert_bias_E)
    titan(x)
    counts = tokens_per_expert(t_idx, E)
    assert torch.equal(counts, titan.tokens_per_expert_E), (counts, titan.tokens_per_expert_E)

    class Hooks:  # torchtitan's OptimizersContainer, as far as the hook needs it
        def register_step_pre_hook(self, fn):
            self.fn = fn

    class Dims:  # one process: no ep, tp or loss mesh
        ep_enabled, tp = False, 1

        def get_optional_mesh(self, name):
            return None

    block = torch.nn.Module()
    block.moe_enabled, block.moe = True, titan
    part = torch.nn.Module()
    part.layers = torch.nn.ModuleDict({"0": block})
    hooks = Hooks()
    register_moe_load_balancing_hook(hooks, [part], Dims())
    hooks.fn()
    torch.testing.assert_close(titan.expert_bias_E, bias_before + expert_bias_delta(counts, titan.load_balance_coeff),
                               atol=0, rtol=0)
    assert not titan.tokens_per_expert_E.any()  # torchtitan resets the counts; ours are a pure function


def test_bad_router_configs_name_the_fix() -> None:
    with pytest.raises(ValueError, match="score_func"):
        MoEConfig(score_func="relu")
    with pytest.raises(ValueError, match="n_expert_groups=3"):
        MoEConfig(n_experts=8, n_expert_groups=3, n_limited_groups=1)
    with pytest.raises(ValueError, match="n_limited_groups=None"):
        MoEConfig(n_experts=8, n_expert_groups=4)

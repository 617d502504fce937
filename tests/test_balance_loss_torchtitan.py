"""``add_balance_loss``: the optional load-balancing loss on torchtitan 0.3.0's own ``MoE``.

torchtitan 0.3.0 has no auxiliary loss. The oracle is the loss of torchtitan's own router outputs:
a hook-free copy of the block's ``router`` called in plain torch on the same tokens gives
``(topk_scores, topk_ids, scores)``, and the loss is ``routing.balance_loss`` of those (and, on one
device, also ``paper_loss``: DeepSeek-V3 eq. 17-20 written loop by loop in tests/test_balance_loss.py).

- one device: ``module.aux_loss`` equals both, its gradient to the router gate equals the
  oracle's, the experts get none, and the block's output is unchanged;
- ``expert_parallel`` on simulated ep=2 and ep2 x tp2 meshes (tokens ``Shard(0)`` on ep): every
  rank's loss and the gate's gradient equal one device's.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch.distributed.tensor import distribute_tensor

import dtensor_rules  # noqa: F401
from dtensor_rules.ep import expert_parallel, token_placements
from dtensor_rules.models import add_balance_loss
from dtensor_rules.models.routing import balance_loss
from dtensor_rules.testing import simulated_mesh
from tests._torchtitan import torchtitan_moe
from tests.test_balance_loss import paper_loss

pytestmark = pytest.mark.filterwarnings("ignore:In CPU autocast, but the target dtype is not supported")

B, L, D, E, K, ALPHA = 4, 5, 16, 8, 2, 0.5
TOL = dict(atol=1e-6, rtol=1e-5)


def _tokens() -> torch.Tensor:
    return torch.randn(B, L, D, generator=torch.Generator().manual_seed(1))


def _oracle(model: torch.nn.Module, x: torch.Tensor, mode: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, its gradient to the router gate, torchtitan's (B, L, E) scores) from a hook-free copy
    of torchtitan's router, called in plain torch."""
    plain = copy.deepcopy(model)
    _, ids, scores = plain.router(x, plain.expert_bias_E)
    loss = balance_loss(scores.reshape(-1, E), ids.reshape(-1, K), ALPHA, L if mode == "sequence" else None)
    return loss.detach(), torch.autograd.grad(loss, plain.router.gate.weight)[0], scores.detach()


@pytest.mark.parametrize("score_func", ["sigmoid", "softmax"])
@pytest.mark.parametrize("mode", ["sequence", "batch"])
def test_on_one_device_the_loss_and_router_gradient_are_torchtitans_routers(mode: str, score_func: str) -> None:
    model = torchtitan_moe(score_func=score_func, bias_hot=None)
    model.train()
    x = _tokens()
    want, want_grad, scores = _oracle(model, x, mode)
    out_off = model(x).detach()
    hooks = add_balance_loss(model, mode, ALPHA)
    out = model(x)
    assert torch.equal(out.detach(), out_off)  # the hooks only read
    torch.testing.assert_close(model.aux_loss.detach(), want, **TOL)
    # the papers' formulas, loop by loop, on torchtitan's scores and bias
    torch.testing.assert_close(model.aux_loss.detach(),
                               paper_loss(scores.reshape(-1, E), model.expert_bias_E, K, ALPHA,
                                          L if mode == "sequence" else B * L), **TOL)
    params = dict(model.named_parameters())
    grads = dict(zip(params, torch.autograd.grad(model.aux_loss, list(params.values()), allow_unused=True)))
    torch.testing.assert_close(grads.pop("router.gate.weight"), want_grad, **TOL)
    assert all(g is None for g in grads.values()), {n for n, g in grads.items() if g is not None}
    hooks.remove()
    model(x)
    assert model.aux_loss is None


@pytest.mark.parametrize("mesh_shape,mode,score_func,hooks_after", [((2,), "batch", "softmax", True),
                                                                    ((2, 2), "sequence", "sigmoid", False)])
def test_under_expert_parallel_every_rank_has_the_single_device_loss_and_gradient(
        mesh_shape: tuple[int, ...], mode: str, score_func: str, hooks_after: bool) -> None:
    """The hooks added after ``expert_parallel``, or before it on a block then deep-copied."""
    model = torchtitan_moe(score_func=score_func)
    model.train()
    x = _tokens()
    want, want_grad, _ = _oracle(model, x, mode)
    if not hooks_after:
        add_balance_loss(model, mode, ALPHA)
    src = copy.deepcopy(model)  # outside the simulated mesh: one set of weights for every rank
    tp = "tp" if len(mesh_shape) == 2 else None
    with simulated_mesh(mesh_shape, names=("ep", "tp")[: len(mesh_shape)]) as mesh:
        ep_model = expert_parallel(src, mesh, tp_dim=tp)
        if hooks_after:
            add_balance_loss(ep_model, mode, ALPHA)
        ep_model(distribute_tensor(x, mesh, token_placements(mesh, tp_dim=tp)))
        got = ep_model.aux_loss.full_tensor()
        grad = torch.autograd.grad(ep_model.aux_loss, ep_model.router.gate.weight)[0].full_tensor()
    assert getattr(model, "aux_loss", None) is None  # the copy's hooks wrote to the copy
    for r in got._local_tensors.values():
        torch.testing.assert_close(r, want, **TOL)
    for r in grad._local_tensors.values():
        torch.testing.assert_close(r, want_grad, **TOL)


def test_bad_blocks_and_modes_name_the_fix() -> None:
    from dtensor_rules.models import MoE, MoEConfig

    with pytest.raises(TypeError, match="MoEConfig\\(balance_loss="):
        add_balance_loss(MoE(MoEConfig()), "batch")
    with pytest.raises(TypeError, match="`router` submodule"):
        add_balance_loss(torch.nn.Linear(2, 2), "batch")
    with pytest.raises(ValueError, match="'sequence' or 'batch'"):
        add_balance_loss(torch.nn.Linear(2, 2), "switch")

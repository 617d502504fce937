"""The balance loss across a block's life: hooks removed, hooks added twice, ``copy.deepcopy`` after a forward.

Blocks: the package's ``MoE(MoEConfig(balance_loss=...))``, a small block with a ``router`` submodule
returning ``(topk_scores, topk_ids, scores)`` (what ``add_balance_loss`` reads; no torchtitan
needed) and torchtitan 0.3.0's own ``MoE``. Oracle: ``routing.balance_loss`` of the router's outputs
recomputed in plain torch, and the original block itself for its copy.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import dtensor_rules  # noqa: F401
from dtensor_rules.models import MoE, MoEConfig, add_balance_loss
from dtensor_rules.models.routing import balance_loss
from tests._torchtitan import torchtitan_moe

pytestmark = pytest.mark.filterwarnings("ignore:In CPU autocast, but the target dtype is not supported")

D, E, K, ALPHA = 16, 8, 2, 0.5


class _Router(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(D, E, bias=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        scores = torch.softmax(self.gate(x).float(), dim=-1)
        top = scores.topk(K, dim=-1)
        return top.values, top.indices, scores


class _Block(nn.Module):
    """Routes, then scales a Linear by the top-k scores: enough for the loss's hooks."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.router = _Router()
        self.proj = nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        top, _, _ = self.router(x)
        return self.proj(x) * top.sum(-1, keepdim=True)


def _tokens(seed: int = 1) -> torch.Tensor:
    return torch.randn(3, 5, D, generator=torch.Generator().manual_seed(seed))


def _want(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The batch loss of the block's router outputs, in plain torch (the router's forward, no hooks)."""
    _, ids, scores = block.router.forward(x) if isinstance(block, _Block) else block.router.forward(x, block.expert_bias_E)
    return balance_loss(scores.reshape(-1, scores.shape[-1]), ids.reshape(-1, ids.shape[-1]), ALPHA)


def _hooked_blocks() -> list:
    return [pytest.param(_Block, id="router-block"),
            pytest.param(lambda: torchtitan_moe(n_experts=E, top_k=K), id="torchtitan")]


@pytest.mark.parametrize("make", _hooked_blocks())
def test_removing_the_hooks_clears_the_loss(make) -> None:
    block = make()
    x = _tokens()
    hooks = add_balance_loss(block, "batch", ALPHA)
    out = block(x)
    torch.testing.assert_close(block.aux_loss, _want(block, x))
    (out.sum() + block.aux_loss).backward()
    hooks.remove()
    assert block.aux_loss is None  # the last forward's loss (its graph freed by the backward) is gone
    out = block(x)
    assert block.aux_loss is None  # and no forward brings one back
    out.sum().backward()  # a step without the loss runs; nothing stale to add
    with pytest.raises(TypeError):
        out.sum() + block.aux_loss  # adding the loss after removal fails loudly, never a stale value


@pytest.mark.parametrize("make", _hooked_blocks())
def test_adding_the_loss_twice_is_refused_and_allowed_again_after_remove(make) -> None:
    block = make()
    x = _tokens()
    hooks = add_balance_loss(block, "batch", ALPHA)
    with pytest.raises(ValueError, match="already has a balance loss.*remove\\(\\)"):
        add_balance_loss(block, "sequence", ALPHA)
    hooks.remove()
    add_balance_loss(block, "batch", ALPHA)
    block(x)
    torch.testing.assert_close(block.aux_loss, _want(block, x))


def _own_moe() -> MoE:
    return MoE(MoEConfig(dim=D, hidden=32, n_experts=E, top_k=K, balance_loss="batch", balance_alpha=ALPHA))


def _hooked(make):
    def build() -> nn.Module:
        block = make()
        add_balance_loss(block, "batch", ALPHA)
        return block

    return build


def _gate(block: nn.Module) -> torch.Tensor:
    return block.gate if isinstance(block, MoE) else block.router.gate.weight


@pytest.mark.parametrize("make", [pytest.param(_own_moe, id="own-moe"),
                                  pytest.param(_hooked(_Block), id="router-block"),
                                  pytest.param(_hooked(lambda: torchtitan_moe(n_experts=E, top_k=K)), id="torchtitan")])
def test_deepcopy_after_a_forward_computes_its_own_loss(make) -> None:
    block = make()
    x = _tokens()
    block(x)
    before = block.aux_loss
    twin = copy.deepcopy(block)
    assert twin.aux_loss is None  # the copy holds no loss until its own forward
    assert block.aux_loss is before  # the original keeps its loss and its graph
    block(x)
    twin(x)
    torch.testing.assert_close(twin.aux_loss, block.aux_loss, rtol=0, atol=0)
    # independent graphs: each loss reaches its own gate only, with the same gradient
    g_block = torch.autograd.grad(block.aux_loss, [_gate(block), _gate(twin)], allow_unused=True, retain_graph=True)
    g_twin = torch.autograd.grad(twin.aux_loss, [_gate(twin), _gate(block)], allow_unused=True)
    assert g_block[1] is None and g_twin[1] is None
    torch.testing.assert_close(g_twin[0], g_block[0], rtol=0, atol=0)
    assert torch.autograd.grad(before, _gate(block))[0].abs().sum() > 0  # the pre-copy loss still backprops
    # a copy of the copy also works after its forward
    assert copy.deepcopy(twin).aux_loss is None

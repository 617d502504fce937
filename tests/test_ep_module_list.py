"""``expert_parallel`` on a block whose experts are an ``nn.ModuleList`` (Qwen-MoE-style names), through an adapter.

The block is plain torch (a router ``Linear``, top-k softmax weights, a loop over its experts); the
adapter stacks the experts with ``stack_experts`` and installs the all-to-all region at the block's
expert seam. Oracle: the block itself on one device, before stacking: the output, the token
gradient and every parameter gradient (each expert's ``Linear`` weights, stacked in expert order,
against the stacked parameters' gradients) on simulated ep=2 and ep2 x tp2 meshes, 21 tokens
(uneven shards), fp32 within ``1e-5 + 1e-5 * max|want|``.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import distribute_tensor

import dtensor_rules  # noqa: F401
from dtensor_rules.ep import expert_parallel, token_placements
from dtensor_rules.models import alignment_for
from dtensor_rules.models.stacked_experts import stack_experts
from dtensor_rules.testing import simulated_mesh

D, H, E, K, T = 16, 32, 4, 2, 21


class _Expert(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(D, H, bias=False), nn.Linear(D, H, bias=False)
        self.down_proj = nn.Linear(H, D, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.gate = nn.Linear(D, E, bias=False)
        self.experts = nn.ModuleList(_Expert() for _ in range(E))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, idx = torch.softmax(self.gate(x), dim=-1).topk(K, dim=-1)
        return self.routed(x, idx, weights / weights.sum(-1, keepdim=True))

    def routed(self, x: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            token, slot = torch.where(idx == e)
            out = out.index_add(0, token, expert(x[token]) * weights[token, slot, None])
        return out


class _Adapter:
    gmm_dtype = None
    sum_dtype_is_input = False

    def __init__(self, module: _Block) -> None:
        self.module, self.n_experts = module, len(module.experts)
        self.stacked = stack_experts(module, "experts", w1="gate_proj", w3="up_proj", w2="down_proj")
        self.hidden = self.stacked.w1.shape[1]

    def roles(self) -> dict:
        return {"experts.w1": "expert_in", "experts.w3": "expert_in", "experts.w2": "expert_out",
                "gate.weight": "replicate"}

    def experts(self):
        return self.stacked.weights()

    def alignment(self, dtype: torch.dtype) -> int:
        return alignment_for(dtype)

    def local_experts(self, x_grouped, offs, w1, w3, w2):
        return self.stacked.local_experts(x_grouped, offs, w1, w3, w2)

    def install(self, region) -> None:
        self.module.routed = region


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    tol = 1e-5 + 1e-5 * want.abs().max().item()
    torch.testing.assert_close(got, want, atol=tol, rtol=0)


@pytest.mark.parametrize("mesh_shape", [(2,), (2, 2)])
def test_module_list_experts_equal_one_device(mesh_shape: tuple[int, ...]) -> None:
    model = _Block()
    x = torch.randn(T, D, generator=torch.Generator().manual_seed(1))
    xr = x.clone().requires_grad_()
    out = model(xr)
    out.pow(2).sum().backward()
    stacked_grads = {mine: torch.stack([getattr(e, theirs).weight.grad for e in model.experts])
                     for mine, theirs in (("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj"))}
    src = copy.deepcopy(model)
    src.zero_grad()
    names = ("ep", "tp")[: len(mesh_shape)]
    with simulated_mesh(mesh_shape, names=names) as mesh:
        ep = expert_parallel(src, mesh, tp_dim="tp" if len(mesh_shape) == 2 else None, adapter=_Adapter(src))
        xd = distribute_tensor(x, mesh, token_placements(mesh)).requires_grad_()
        out_d = ep(xd)
        out_d.pow(2).sum().backward()
        got_out, got_x = out_d.full_tensor(), xd.grad.full_tensor()
        got_gate = ep.gate.weight.grad.full_tensor()
        got_experts = {n: getattr(ep.experts, n).grad.full_tensor() for n in stacked_grads}
        assert ep.experts.w1.grad.placements == ep.experts.w1.placements  # the expert gradients stay sharded
    _close(got_out, out.detach())
    _close(got_x, xr.grad)
    _close(got_gate, model.gate.weight.grad)
    for n, want in stacked_grads.items():
        _close(got_experts[n], want)


def test_stack_experts_refuses_what_it_cannot_stack() -> None:
    block = _Block()
    block.experts[2].up_proj = nn.Linear(D, H, bias=True)
    with pytest.raises(TypeError, match=r"expert 2's 'up_proj' must be a bias-free nn.Linear, got a Linear with a bias"):
        stack_experts(block, "experts", w1="gate_proj", w3="up_proj", w2="down_proj")
    with pytest.raises(TypeError, match=r"expert 0's 'w1' must be a bias-free nn.Linear, got NoneType.*w1=, w3=, w2="):
        stack_experts(_Block(), "experts")
    with pytest.raises(TypeError, match=r"_Block.gate is a Linear, not an nn.ModuleList"):
        stack_experts(_Block(), "gate")

"""torchtitan 0.3.0's MoE written on DTensors (not expert_parallel: its own forward, op by op).

Every parameter and buffer is a DTensor, the (B, L, D) tokens are ``Shard(0)`` on the first mesh
dim, and torchtitan's own code runs: router, ``LocalTokenDispatcher`` (argsort, gathers), the
combine through its custom op ``torchtitan::deterministic_scatter_add`` (kept: the package's rule
places it), the shared expert. One seam is changed: ``GroupedExperts.forward`` converts DTensor
weights to local tensors (it is written for torchtitan's ``local_map`` region), which would mix
plain tensors and DTensors; the test runs the same math (cumsum offsets, bf16 casts, its
``_grouped_mm`` seam, ``type_as``) on the DTensors instead.

Output, the token gradient and every parameter gradient equal torchtitan's single device: fp32 on a 1-D mesh within
1e-5 (+ 1e-5 relative); bf16 within 4 bf16 ulps of the largest |value|; with the experts' hidden
dim split over tp (2x2), within 4 bf16 ulps, since each tp rank's partial ``w2`` product is
rounded to bf16 before the sum. Without our rule for the custom op the same forward stops at it.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from dtensor_rules import registry
from dtensor_rules.ep.expert_parallel import distribute_named
from dtensor_rules.testing import simulated_mesh
from tests._torchtitan import require_torchtitan, torchtitan_moe

pytestmark = pytest.mark.filterwarnings("ignore:In CPU autocast, but the target dtype is not supported")


def _plan(model: torch.nn.Module, ndim: int) -> dict[str, tuple]:
    """Experts Shard(0) on the first dim (hidden Shard on the second), shared expert col/rowwise, the rest R."""
    R = Replicate()
    plan = {name: (R,) * ndim for name, _ in model.named_parameters()}
    plan |= {name: (R,) * ndim for name, _ in model.named_buffers()}
    pre = "routed_experts.inner_experts."
    if ndim == 1:
        plan |= {pre + w: (Shard(0),) for w in ("w1_EFD", "w3_EFD", "w2_EDF")}
    else:
        plan |= {pre + "w1_EFD": (Shard(0), Shard(1)), pre + "w3_EFD": (Shard(0), Shard(1)),
                 pre + "w2_EDF": (Shard(0), Shard(2)), "shared_experts.w1.weight": (R, Shard(0)),
                 "shared_experts.w3.weight": (R, Shard(0)), "shared_experts.w2.weight": (R, Shard(1))}
    return plan


def _experts_on_dtensors(inner: torch.nn.Module) -> None:
    """GroupedExperts.forward's math without its to_local() of the weights."""
    def forward(x_RD: torch.Tensor, num_tokens_per_expert_E: torch.Tensor) -> torch.Tensor:
        offs = torch.cumsum(num_tokens_per_expert_E, dim=0, dtype=torch.int32)
        gmm = inner._grouped_mm
        h = F.silu(gmm(A=x_RD.bfloat16(), B_t=inner.w1_EFD.bfloat16().transpose(-2, -1), offs=offs))
        h = h * gmm(A=x_RD.bfloat16(), B_t=inner.w3_EFD.bfloat16().transpose(-2, -1), offs=offs)
        return gmm(A=h, B_t=inner.w2_EDF.bfloat16().transpose(-2, -1), offs=offs).type_as(x_RD)

    inner.forward = forward


def _run(mesh_shape: tuple[int, ...], dtype: torch.dtype) -> tuple[dict, dict]:
    model = torchtitan_moe(score_func="sigmoid").to(dtype)
    model.train()
    src = copy.deepcopy(model)
    g = torch.Generator().manual_seed(3)
    x, cot = (torch.randn(4, 5, 16, generator=g).to(dtype) for _ in range(2))
    xr = x.clone().requires_grad_()
    out = model(xr)
    (out * cot).sum().backward()
    want = {"output": out.detach(), "grad x": xr.grad, **{n: p.grad for n, p in model.named_parameters()}}
    ndim = len(mesh_shape)
    with simulated_mesh(mesh_shape, names=("ep", "tp")[:ndim]) as mesh:
        distribute_named(src, mesh, _plan(src, ndim))
        _experts_on_dtensors(src.routed_experts.inner_experts)
        place = (Shard(0),) + (Replicate(),) * (ndim - 1)
        xd = distribute_tensor(x, mesh, place).requires_grad_()
        outd = src(xd)
        (outd * distribute_tensor(cot, mesh, outd.placements if ndim == 1 else place)).sum().backward()
        got = {"output": outd.full_tensor(), "grad x": xd.grad.full_tensor(),
               **{n: p.grad.full_tensor() for n, p in src.named_parameters()}}
    return got, want


@pytest.mark.parametrize("mesh_shape,dtype", [((2,), torch.float32), ((2,), torch.bfloat16), ((2, 2), torch.float32)])
def test_torchtitan_moe_on_dtensors_equals_one_device(mesh_shape: tuple[int, ...], dtype: torch.dtype) -> None:
    require_torchtitan("torchtitan.ops.scatter_add")
    op = torch.ops.torchtitan.deterministic_scatter_add.default
    assert registry.get_rule(op).module == "dtensor_rules.op_rules.torchtitan_ops"
    got, want = _run(mesh_shape, dtype)
    exact = dtype == torch.float32 and len(mesh_shape) == 1
    for name, w in want.items():
        w = w.float()
        bound = (1e-5 + 1e-5 * float(w.abs().max())) if exact else 4 * float(w.abs().max()) * 2.0**-8
        for r, c in sorted(got[name]._local_tensors.items()):
            diff = float((c.float() - w).abs().max())
            assert diff <= bound, f"{name} rank {r} {mesh_shape} {dtype}: |diff| {diff} > {bound}"


def test_without_our_rule_the_forward_stops_at_the_custom_op() -> None:
    """The contrast: the same run with our deterministic_scatter_add rule taken out of DTensor."""
    require_torchtitan("torchtitan.ops.scatter_add")
    op = torch.ops.torchtitan.deterministic_scatter_add.default
    registry.uninstall(ops=[op])
    try:
        with pytest.raises(NotImplementedError, match="deterministic_scatter_add"):
            _run((2,), torch.float32)
    finally:
        registry.install(ops=[op])
    assert registry.status()[op]["active"] == "ours"

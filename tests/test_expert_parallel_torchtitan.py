"""``expert_parallel`` on torchtitan 0.3.0's own DeepSeek-V3 ``MoE`` (through ``TorchtitanMoEAdapter``).

The oracle is torchtitan's module itself on one device (its router, its ``GroupedExperts`` in
bf16, its ``deterministic_scatter_add`` combine). The copy given to ``expert_parallel`` runs on a
simulated mesh (every rank in this process) with (B, L, D) tokens ``Shard(0)`` on ep: output, the
token gradient and every parameter gradient equal the oracle, expert weights and their gradients
stay ``Shard(0)`` on ep, and only all-to-alls move tokens (no all_gather).

Tolerances: ep alone moves whole rows, so every value is the oracle's up to fp32 reassociation
(1e-5). With expert TP the hidden dim is split and torchtitan's expert math rounds each rank's
partial ``w2`` product to bf16 before the tp sum (torchtitan's own expert TP does the same):
there the bound is 4 bf16 ulps of the largest |value| (the bound tests/test_expert_parallel.py
uses for bf16).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode

import dtensor_rules  # noqa: F401
from dtensor_rules.ep import expert_param_bytes, expert_parallel, token_placements
from dtensor_rules.ep.adapters import EPAdapter, TorchtitanMoEAdapter, adapter_for
from dtensor_rules.testing import simulated_mesh
from tests._torchtitan import require_torchtitan, torchtitan_moe

pytestmark = pytest.mark.filterwarnings("ignore:In CPU autocast, but the target dtype is not supported")

EXPERTS = ("w1_EFD", "w3_EFD", "w2_EDF")


def _bound(want: torch.Tensor, tp: bool) -> float:
    if not tp:
        return 1e-5 + 1e-5 * float(want.abs().max())
    return 4 * float(want.abs().max()) * 2.0**-8  # 4 bf16 ulps at the largest |value|


CASES = [
    ((2,), "softmax", None),
    ((4,), "sigmoid", None),
    ((4,), "softmax", 5),  # every token picks expert 5: one ep rank receives every row, the others none
    ((2, 2), "sigmoid", None),
]


@pytest.mark.parametrize("mesh_shape,score_func,hot", CASES)
def test_torchtitan_moe_equals_its_single_device(mesh_shape: tuple[int, ...], score_func: str, hot: int | None) -> None:
    model = torchtitan_moe(score_func=score_func, bias_hot=hot)
    model.train()
    src = copy.deepcopy(model)  # made outside the simulated mesh: one set of weights for every rank
    g = torch.Generator().manual_seed(1)
    x, cot = torch.randn(4, 5, 16, generator=g), torch.randn(4, 5, 16, generator=g)
    xr = x.clone().requires_grad_()
    out = model(xr)
    (out * cot).sum().backward()
    names = [n for n, _ in model.named_parameters()]
    want = {"output": out.detach(), "grad x": xr.grad, **{n: p.grad for n, p in model.named_parameters()}}

    tp = "tp" if len(mesh_shape) == 2 else None
    with simulated_mesh(mesh_shape, names=("ep", "tp")[: len(mesh_shape)]) as mesh:
        ep_model = expert_parallel(src, mesh, tp_dim=tp)
        place = token_placements(mesh, tp_dim=tp)
        xd = distribute_tensor(x, mesh, place).requires_grad_()
        cotd = distribute_tensor(cot, mesh, place)
        with CommDebugMode() as comm:
            outd = ep_model(xd)
            (outd * cotd).sum().backward()
        params = dict(ep_model.named_parameters())
        got = {"output": outd.full_tensor(), "grad x": xd.grad.full_tensor(),
               **{n: params[n].grad.full_tensor() for n in names}}
        placements = {n: (params[n].placements, params[n].grad.placements) for n in names}
        tokens = ep_model.tokens_per_expert_E.full_tensor()
        bytes_held = expert_param_bytes(ep_model)
    for name, w in want.items():
        for r, c in sorted(got[name]._local_tensors.items()):
            diff = float((c - w).abs().max())
            assert diff <= _bound(w, tp is not None), f"{name} rank {r} {mesh_shape} {score_func}: |diff| {diff}"
    counts = {str(k): v for k, v in comm.get_comm_counts().items()}
    assert not any("all_gather" in k for k in counts), counts
    assert counts.get("c10d_functional.all_to_all_single") == 5, counts  # counts, rows out, rows back; 2 backward
    for n in names:
        p, gp = placements[n]
        if n.rsplit(".", 1)[-1] in EXPERTS:
            assert p[0] == Shard(0) and gp == p, (n, p, gp)  # experts and their grads: Shard(0) on ep
        else:
            assert p[0] == Replicate(), (n, p)
    # the Partial counter sums every rank's own tokens: torchtitan's global count
    for c in tokens._local_tensors.values():
        assert torch.equal(c, model.tokens_per_expert_E)
    total = sum(getattr(model.routed_experts.inner_experts, w).numel() * 4 for w in EXPERTS)
    assert bytes_held == (total // mesh.size(), total // mesh.size())


def test_torchtitan_adapter_follows_the_protocol_and_unknown_blocks_name_the_fix() -> None:
    model = torchtitan_moe()
    a = adapter_for(model)
    assert isinstance(a, TorchtitanMoEAdapter) and isinstance(a, EPAdapter)
    assert a.experts().layout == "EHD" and (a.n_experts, a.hidden) == (8, 32)
    roles = a.roles()
    assert roles["routed_experts.inner_experts.w2_EDF"] == "expert_out"
    assert roles["shared_experts.w2.weight"] == "rowwise" and roles["router.gate.weight"] == "replicate"
    with simulated_mesh((2,), names=("ep",)) as mesh, pytest.raises(TypeError, match="adapter="):
        expert_parallel(torch.nn.Linear(2, 2), mesh, tp_dim=None)
    with simulated_mesh((3,), names=("ep",)) as mesh, pytest.raises(ValueError, match=r"n_experts=8 .* 'ep' mesh size 3"):
        expert_parallel(torchtitan_moe(), mesh, tp_dim=None)


def test_require_torchtitan_imports_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under CI a missing module is an ImportError, not a skip (the guard cannot pass silently)."""
    monkeypatch.setenv("CI", "1")
    with pytest.raises(ImportError):
        require_torchtitan("torchtitan_no_such_module_for_the_guard")

"""``expert_parallel`` on a block built on the meta device, as torchtitan's trainer builds its model.

Wrapping reads no values: every parameter and buffer stays a meta DTensor until
``module.to_empty(device=...)``; then the values are written into the DTensors in their own
placements (what a checkpoint load or the model's init does), the counter is zeroed, and the block
equals the same block built with values on one device (torchtitan's module itself is the oracle).
Meshes: ep4, ep2 x tp2, and torchtitan's mesh model (EP borrowing both dims of a 2x2 mesh).
Tolerances as in tests/test_expert_parallel_torchtitan.py: fp32 reassociation without expert TP,
4 bf16 ulps of the largest value with it (each tp rank rounds its partial ``w2`` product to bf16).
"""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import DTensor, Partial, distribute_tensor

import dtensor_rules  # noqa: F401
from dtensor_rules.ep import expert_parallel, token_placements
from dtensor_rules.testing import simulated_mesh
from tests._torchtitan import torchtitan_moe

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:In CPU autocast, but the target dtype is not supported")]

MESHES = [
    ((4,), ("ep",), {"tp_dim": None}),
    ((2, 2), ("ep", "tp"), {}),
    ((2, 2), ("dp_shard", "tp"), {"ep_dims": ("dp_shard", "tp")}),
]


def _load(module: torch.nn.Module, values: dict[str, torch.Tensor]) -> None:
    """Write the full ``values`` into the module's DTensors in their own placements; counters (Partial) zero."""
    with torch.no_grad():
        for name, t in [*module.named_parameters(), *module.named_buffers()]:
            assert isinstance(t, DTensor), name
            if any(isinstance(p, Partial) for p in t.placements):
                t.to_local().zero_()
            else:
                t.copy_(distribute_tensor(values[name], t.device_mesh, t.placements))


@pytest.mark.parametrize("mesh_shape,names,kwargs", MESHES, ids=["ep4", "ep2xtp2", "borrowed2x2"])
def test_meta_block_wraps_without_values_and_equals_one_device_after_to_empty(mesh_shape, names, kwargs) -> None:
    ref = torchtitan_moe(score_func="sigmoid")
    ref.train()
    values = {n: t.detach().clone() for n, t in [*ref.named_parameters(), *ref.named_buffers()]}
    g = torch.Generator().manual_seed(1)
    x, cot = torch.randn(4, 5, 16, generator=g), torch.randn(4, 5, 16, generator=g)
    xr = x.clone().requires_grad_()
    out = ref(xr)
    (out * cot).sum().backward()
    want = {"output": out.detach(), "grad x": xr.grad, **{n: p.grad for n, p in ref.named_parameters()}}

    model = torchtitan_moe(score_func="sigmoid", meta=True)
    model.train()
    with simulated_mesh(mesh_shape, names=names) as mesh:
        expert_parallel(model, mesh, **kwargs)
        held = [*model.named_parameters(), *model.named_buffers()]
        assert all(isinstance(t, DTensor) and t.is_meta for _, t in held), [n for n, t in held if not t.is_meta]
        model.to_empty(device="cpu")
        _load(model, values)
        place = token_placements(mesh, ep_dims=kwargs["ep_dims"]) if "ep_dims" in kwargs else \
            token_placements(mesh, tp_dim=kwargs.get("tp_dim", "tp"))
        xd = distribute_tensor(x, mesh, place).requires_grad_()
        outd = model(xd)
        (outd * distribute_tensor(cot, mesh, place)).sum().backward()
        params = dict(model.named_parameters())
        got = {"output": outd.full_tensor(), "grad x": xd.grad.full_tensor(),
               **{n: params[n].grad.full_tensor() for n in want if n in params}}
    expert_tp = names == ("ep", "tp")
    for name, w in want.items():
        bound = 4 * float(w.abs().max()) * 2.0**-8 if expert_tp else 1e-5 + 1e-5 * float(w.abs().max())
        for r, c in sorted(got[name]._local_tensors.items()):
            diff = float((c - w).abs().max())
            assert diff <= bound, f"{name} rank {r} {names}: |diff| {diff} > {bound}"


def test_a_counter_holding_counts_is_refused_with_values_and_never_read_on_meta() -> None:
    """The counter check reads values only where there are values: a used counter is refused, a meta one passes."""
    used = torchtitan_moe()
    used.tokens_per_expert_E.fill_(3.0)
    with simulated_mesh((2,), names=("ep",)) as mesh:
        with pytest.raises(ValueError, match="tokens_per_expert_E is a counter .* holds counts: zero it"):
            expert_parallel(used, mesh, tp_dim=None)
        meta = expert_parallel(torchtitan_moe(meta=True), mesh, tp_dim=None)
        assert meta.tokens_per_expert_E.is_meta and isinstance(meta.tokens_per_expert_E, DTensor)

"""``expert_parallel(..., ep_dims=...)``: torchtitan's mesh model (EP borrowed from the data/sequence dims).

Oracle: the same block on one device. Simulated meshes (every rank in this process) check the
output and every gradient (fp32, ``1e-5 + 1e-5 * max|want|``), uneven token counts included, and
that only all-to-alls run. The byte comparison runs torchtitan 0.3.0's OWN EP path (its
``MoE.forward``, ``AllToAllTokenDispatcher``, ``GroupedExperts`` on each rank's expert slice: what
its ``local_map`` region runs) on real gloo ranks with the same weights and tokens
(``tests/_ttmesh_workers.py``); torchtitan's dispatcher does not run on a simulated mesh (its
``_unpermute`` sizes a tensor from per-rank counts).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode

import dtensor_rules  # noqa: F401
from dtensor_rules.ep import expert_param_bytes, expert_parallel, token_placements
from dtensor_rules.models import MoE, MoEConfig
from dtensor_rules.testing import run_gloo, simulated_mesh
from tests._torchtitan import require_torchtitan, torchtitan_moe

pytestmark = pytest.mark.filterwarnings("ignore:In CPU autocast, but the target dtype is not supported")

NAMES = ("dp_shard", "tp")


def _rows(d) -> torch.Tensor:
    """The full tokens of a DTensor split on every mesh dim along dim 0: the ranks' shards in rank order.

    Not ``full_tensor()``: once a mesh has a flattened dim (the ep4 group), torch 2.13's DTensor
    gathers uneven nested ``(Shard(0), Shard(0))`` shards with padding rows left in (upstream, with
    or without this package: ``arange(21)`` comes back as ``[0..10, 0, 11..15, 0, 16..18]``)."""
    if not all(isinstance(p, Shard) for p in d.placements):
        return d.full_tensor()
    shards = d.to_local()._local_tensors
    return torch.cat([shards[r] for r in sorted(shards)])


def _bound(want: torch.Tensor) -> float:
    return 1e-5 + 1e-5 * float(want.abs().max())


def _check(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], bf16: tuple[str, ...] = ()) -> None:
    for name, w in want.items():
        diff = float((got[name] - w).detach().abs().max())
        bound = 4 * float(w.abs().max()) * 2.0**-8 if name in bf16 else _bound(w)  # 4 bf16 ulps at max|want|
        assert diff <= bound, f"{name}: max |diff| {diff:.3g} > {bound:.3g}"


CASES = [  # (mesh, ep_dims, tokens): 21 and 22 give uneven shards; 3 fewer tokens than ranks (an empty rank)
    ((2, 2), ("tp",), 21),  # ep2 x tp2 in torchtitan's sense: ep = tp, efsdp = dp_shard
    ((2, 2), ("dp_shard", "tp"), 22),  # ep4: the flattened group
    ((2, 2), ("dp_shard",), 21),  # ep over the outer dim, efsdp = tp
    ((1, 4), ("tp",), 21),
    ((2, 2), ("dp_shard", "tp"), 3),
]


@pytest.mark.parametrize("mesh_shape,ep_dims,tokens", CASES)
def test_borrowed_ep_equals_one_device(mesh_shape: tuple[int, int], ep_dims: tuple[str, ...], tokens: int) -> None:
    model = MoE(MoEConfig(dim=16, hidden=32, n_experts=4, top_k=2))
    g = torch.Generator().manual_seed(tokens)
    x, cot = torch.randn(tokens, 16, generator=g), torch.randn(tokens, 16, generator=g)
    xr = x.clone().requires_grad_()
    out = model(xr)
    (out * cot).sum().backward()
    want = {"output": out.detach(), "grad x": xr.grad, **{n: p.grad for n, p in model.named_parameters()}}
    model.zero_grad()
    with simulated_mesh(mesh_shape, names=NAMES) as mesh:
        m = expert_parallel(copy.deepcopy(model), mesh, ep_dims=ep_dims)
        place = token_placements(mesh, ep_dims=ep_dims)
        assert place == (Shard(0), Shard(0))  # every rank its own tokens
        xd = distribute_tensor(x, mesh, place).requires_grad_()
        cotd = distribute_tensor(cot, mesh, place)
        with CommDebugMode() as comm:
            outd = m(xd)
            (outd * cotd).sum().backward()
        counts = {str(k): v for k, v in comm.get_comm_counts().items()}
        params = dict(m.named_parameters())
        got = {"output": _rows(outd), "grad x": _rows(xd.grad), **{n: p.grad.full_tensor() for n, p in params.items()}}
        if tokens >= mesh.size():
            # (with fewer tokens than ranks DTensor all-gathers inside the router's own ops; the region
            # still only all-to-alls, and the result is still exact)
            assert outd.placements == place and xd.grad.placements == place  # no Partial: no tp all_reduce
        ep_pl = tuple(Shard(0) if n in ep_dims else Replicate() for n in NAMES)
        ep_grad = tuple(Shard(0) if n in ep_dims else Partial() for n in NAMES)
        for n in ("w1", "w3", "w2"):
            assert params[n].placements == ep_pl and params[n].grad.placements == ep_grad
        n_ep = 1
        for d in ep_dims:
            n_ep *= mesh.size(NAMES.index(d))
        held, _ = expert_param_bytes(m)
    _check(got, want)
    if tokens >= 4:
        assert counts == {"c10d_functional.all_to_all_single": 5}, counts  # counts, tokens out/back, 2 backward
    else:
        assert counts["c10d_functional.all_to_all_single"] == 5
    assert held == sum(model.get_parameter(n).numel() for n in ("w1", "w3", "w2")) * 4 // n_ep


@pytest.mark.slow  # torchtitan's import and bf16 grouped mm
def test_borrowed_ep_torchtitan_moe_equals_its_single_device() -> None:
    """torchtitan's block, (B, L, D) tokens batch-sharded on dp_shard and sequence-sharded on tp.

    fp32 bound for the output and every gradient except the expert weights': those come out of
    torchtitan's bf16 grouped matmul on each efsdp rank's tokens and are summed over efsdp after,
    where one device rounds the whole sum once (torchtitan's own EP + FSDP rounds the same way)."""
    model = torchtitan_moe(score_func="sigmoid")
    model.train()
    src = copy.deepcopy(model)
    g = torch.Generator().manual_seed(1)
    x, cot = torch.randn(4, 6, 16, generator=g), torch.randn(4, 6, 16, generator=g)
    xr = x.clone().requires_grad_()
    out = model(xr)
    (out * cot).sum().backward()
    want = {"output": out.detach(), "grad x": xr.grad, **{n: p.grad for n, p in model.named_parameters()}}
    tok = (Shard(0), Shard(1))
    with simulated_mesh((2, 2), names=NAMES) as mesh:
        m = expert_parallel(src, mesh, ep_dims=("tp",))
        xd = distribute_tensor(x, mesh, tok).requires_grad_()
        cotd = distribute_tensor(cot, mesh, tok)
        with CommDebugMode() as comm:
            outd = m(xd)
            (outd * cotd).sum().backward()
        params = dict(m.named_parameters())
        got = {"output": outd.full_tensor(), "grad x": xd.grad.full_tensor(),  # (even shards: full_tensor is right)
               **{n: params[n].grad.full_tensor() for n in want if n in params}}
        counts = {str(k): v for k, v in comm.get_comm_counts().items()}
        tokens_seen = m.tokens_per_expert_E.full_tensor()
    _check(got, want, bf16=tuple(f"routed_experts.inner_experts.{n}" for n in ("w1_EFD", "w3_EFD", "w2_EDF")))
    assert counts == {"c10d_functional.all_to_all_single": 5}, counts
    assert torch.equal(tokens_seen, model.tokens_per_expert_E)


def test_borrowed_ep_rejects_bad_dims_and_replicated_tokens() -> None:
    model = MoE(MoEConfig(dim=8, hidden=16, n_experts=4, top_k=1))
    with simulated_mesh((2, 2), names=NAMES) as mesh:
        with pytest.raises(ValueError, match="must name distinct dims"):
            expert_parallel(copy.deepcopy(model), mesh, ep_dims=("ep",))
        with pytest.raises(ValueError, match="mesh's dim order"):
            expert_parallel(copy.deepcopy(model), mesh, ep_dims=("tp", "dp_shard"))
        m = expert_parallel(copy.deepcopy(model), mesh, ep_dims=("tp",))
        with pytest.raises(ValueError, match="split on every mesh dim"):
            m(distribute_tensor(torch.randn(8, 8), mesh, (Shard(0), Replicate())))
    with simulated_mesh((1, 8), names=NAMES) as mesh:
        with pytest.raises(ValueError, match="not divisible by the ep size 8"):
            expert_parallel(copy.deepcopy(model), mesh, ep_dims=("tp",))


@pytest.mark.slow  # 4 gloo processes importing torchtitan: 20-40 s on the 2-core machine
def test_ep2xtp2_bytes_at_most_torchtitans_own_path() -> None:
    """ep2 x tp2 in torchtitan's sense (dp_shard 2 x tp 2, ep borrowed from tp, efsdp = dp_shard):
    ours moves at most torchtitan's all-to-all bytes and runs no collective it does not; our expert
    TP on an (ep, tp) mesh moves twice its all-to-all bytes plus an all_reduce (its stated cost)."""
    require_torchtitan()
    from tests._ttmesh_workers import Sizes, compare_rank

    per_rank = run_gloo(compare_rank, 4, "ep2xtp2", 0, Sizes(seq=16))
    for res in per_rank:
        tt, ours, etp = res["torchtitan"], res["ours"], res["ours_etp"]
        assert set(ours.calls) <= set(tt.calls) == {"all_to_all"}, (ours.calls, tt.calls)
        assert ours.calls["all_to_all"] <= tt.calls["all_to_all"]
        assert ours.bytes["all_to_all"] <= tt.bytes["all_to_all"], (ours.bytes, tt.bytes)
        assert ours.out_sum == pytest.approx(tt.out_sum, rel=1e-5, abs=1e-5)  # same tokens on the same rank
        assert ours.expert_bytes == tt.expert_bytes
        # expert TP: half the expert bytes, but every tp rank sends the same rows, then an all_reduce
        assert etp.expert_bytes * 2 == ours.expert_bytes
        assert etp.bytes["all_to_all"] > ours.bytes["all_to_all"] and "all_reduce" in etp.calls

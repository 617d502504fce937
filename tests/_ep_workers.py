"""Rank functions for the expert-parallel tests (module level, so ``run_gloo`` can spawn them).

Each worker builds the same seeded MoE block on every rank, runs it once on one device
(the oracle: plain torch on the full batch) and once expert-parallel, and returns plain
Python numbers so the parent process asserts.
"""

from __future__ import annotations

import copy
import logging
import warnings
from typing import NamedTuple

import torch

import dtensor_rules  # noqa: F401  (installs the rules)
from dtensor_rules.models import MoE, MoEConfig

CASES = {
    # name: (top_k, expert_bias) -- the bias only steers selection (weights stay unbiased)
    "random": (2, None),
    "zero_expert": (2, (0.0, -10.0, 0.0, 0.0)),  # expert 1 never chosen
    "all_to_one": (1, (10.0, 0.0, 0.0, 0.0)),  # every token to expert 0: ep rank 1 receives nothing
}
TOKENS = 21  # uneven: 11/10 rows per ep rank on ep=2, 6/5/5/5 on ep=4


class RankResult(NamedTuple):
    diffs: dict[str, float]  # max |ep - single device| per tensor
    bounds: dict[str, float]  # the tolerance each diff must stay within
    grad_placements: dict[str, str]
    expert_bytes: tuple[int, int]  # (params, grads) held by this rank
    expert_total_bytes: int
    comm: dict[str, dict[str, int]]  # phase -> collective -> calls
    comm_bytes: dict[str, dict[str, int]]
    local_expert_grad_abs: float  # sum |local w1/w3/w2 grad| on this rank: 0 where its experts got no tokens


def make_model(case: str, dtype: torch.dtype, n_experts: int = 4) -> MoE:
    top_k, bias = CASES[case]
    model = MoE(MoEConfig(dim=16, hidden=32, n_experts=n_experts, top_k=top_k), dtype=dtype)
    model.init_weights(2)
    if bias is not None:
        model.expert_bias.copy_(torch.tensor(bias))
    return model


def oracle(model: MoE, x: torch.Tensor, cot: torch.Tensor, scale: float = 1.0) -> dict[str, torch.Tensor]:
    """Output and gradients of ``scale * (model(x) * cot).sum()`` on one device."""
    xr = x.clone().requires_grad_()
    out = model(xr)
    names = [n for n, _ in model.named_parameters()]
    grads = torch.autograd.grad((out * cot).sum() * scale, [xr, *model.parameters()])
    return {"output": out.detach(), "grad x": grads[0], **{f"grad {n}": g for n, g in zip(names, grads[1:])}}


def bound(want: torch.Tensor) -> float:
    """fp32: 1e-5 + 1e-5 * max|want|; bf16: 4 bf16 ulps (4 * 2**-7) of max|want|, plus 2**-20.

    The absolute 2**-20 covers gradients that are zero up to rounding noise (top-1 routing
    with normalized weights: every weight is exactly 1, so the gate's gradient is noise).
    """
    m = want.abs().max().item()
    return 1e-5 + 1e-5 * m if want.dtype == torch.float32 else 4 * 2**-7 * m + 2**-20


def _inputs(dtype: torch.dtype, tokens: int = TOKENS) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(tokens, 16, generator=torch.Generator().manual_seed(5)).to(dtype)
    cot = torch.randn(tokens, 16, generator=torch.Generator().manual_seed(6)).to(dtype)
    return x, cot


def _result(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], model: MoE, placements: dict[str, str],
            comm: dict, comm_bytes: dict) -> RankResult:
    from dtensor_rules.ep.expert_parallel import expert_param_bytes

    diffs = {k: (got[k].float() - want[k].float()).abs().max().item() for k in want}
    bounds = {k: bound(want[k]) for k in want}
    total = sum(want[f"grad {n}"].numel() * want[f"grad {n}"].element_size() for n in ("w1", "w3", "w2"))
    local_abs = sum(w.grad.to_local().abs().sum().item() for w in (model.w1, model.w3, model.w2))
    return RankResult(diffs, bounds, placements, expert_param_bytes(model), total, comm, comm_bytes, local_abs)


def _quiet() -> None:
    """No warnings or 'suboptimal redistribute' notes from the ranks (full_tensor of 2-D Partials)."""
    warnings.simplefilter("ignore")
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)


class WorkerResult(NamedTuple):
    runs: list[RankResult]  # one per (case, dtype)
    gather_calls: dict[str, dict[str, int]] | None  # the shard_moe gather path's collectives (2-D mesh)


def ep_worker(rank: int, world: int, mesh_shape: tuple[int, ...],
              runs: list[tuple[str, torch.dtype]]) -> WorkerResult:
    """EP (x TP) on a real gloo mesh ``mesh_shape`` = (ep,) or (ep, tp), one result per (case, dtype)."""
    from torch.distributed.device_mesh import init_device_mesh

    _quiet()
    names = ("ep", "tp")[: len(mesh_shape)]
    mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=names)
    results = [_ep_run(mesh, case, dtype) for case, dtype in runs]
    return WorkerResult(results, _gather_calls(mesh) if mesh.ndim == 2 else None)


def _gather_calls(mesh) -> dict[str, dict[str, int]]:  # type: ignore[no-untyped-def]
    """Collective calls of one forward+backward of the ``shard_moe`` gather path (the contrast)."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from dtensor_rules.models import shard_moe
    from dtensor_rules.testing.comm import CommBytesMode

    model = shard_moe(make_model("random", torch.float32), mesh)
    x, cot = (t[:20] for t in _inputs(torch.float32))  # even: the gather path cannot flatten uneven shards
    xd = distribute_tensor(x, mesh, (Shard(0), Replicate()))
    with CommBytesMode() as comm:
        (model(xd) * distribute_tensor(cot, mesh, (Shard(0), Replicate()))).sum().backward()
    return {k: dict(v) for k, v in comm.calls.items()}


def _ep_run(mesh, case: str, dtype: torch.dtype) -> RankResult:  # type: ignore[no-untyped-def]
    from torch.distributed.tensor import distribute_tensor

    from dtensor_rules.ep.expert_parallel import expert_parallel, token_placements
    from dtensor_rules.testing.comm import CommBytesMode

    model = make_model(case, dtype)
    x, cot = _inputs(dtype)
    want = oracle(model, x, cot)
    tp = "tp" if mesh.ndim == 2 else None
    ep_model = expert_parallel(copy.deepcopy(model), mesh, tp_dim=tp)
    place = token_placements(mesh, tp_dim=tp)
    xd = distribute_tensor(x, mesh, place).requires_grad_()
    cotd = distribute_tensor(cot, mesh, place)
    with CommBytesMode() as comm:
        out = ep_model(xd)
        (out * cotd).sum().backward()
    got = {"output": out.full_tensor(), "grad x": xd.grad.full_tensor()}
    placements = {}
    for n, p in ep_model.named_parameters():
        got[f"grad {n}"] = p.grad.full_tensor()
        placements[n] = str(tuple(p.grad.placements))
    return _result(got, want, ep_model, placements, {k: dict(v) for k, v in comm.calls.items()},
                   {k: dict(v) for k, v in comm.bytes.items()})


def fsdp_worker(rank: int, world: int, case: str) -> RankResult:
    """EP x TP x FSDP2 on a (dp=2, ep=2, tp=2) gloo mesh; each dp rank runs its half of the batch."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import distribute_tensor

    from dtensor_rules.ep.expert_parallel import expert_parallel, token_placements

    _quiet()
    dtype = torch.float32
    model = make_model(case, dtype)
    x, cot = _inputs(dtype, 22)  # 11 tokens per dp rank (equal, for the test's own all_gather), 6/5 over ep
    dp = 2
    want = oracle(model, x, cot, scale=1.0 / dp)  # FSDP averages the gradients over dp
    world_mesh = init_device_mesh("cpu", (dp, 2, 2), mesh_dim_names=("dp", "ep", "tp"))
    sub = world_mesh["ep", "tp"]
    ep_model = expert_parallel(copy.deepcopy(model), sub)
    fully_shard(ep_model, mesh=world_mesh["dp"])
    d = world_mesh.get_local_rank("dp")
    place = token_placements(sub)
    xd = distribute_tensor(x.chunk(dp)[d].contiguous(), sub, place).requires_grad_()
    cotd = distribute_tensor(cot.chunk(dp)[d].contiguous(), sub, place)
    out = ep_model(xd)
    (out * cotd).sum().backward()
    got = {}
    # every dp rank's output and x gradient cover its own half: gather the halves over dp
    halves_out = [torch.empty_like(out.full_tensor()) for _ in range(dp)]
    halves_gx = [torch.empty_like(halves_out[0]) for _ in range(dp)]
    dp_group = world_mesh.get_group("dp")
    torch.distributed.all_gather(halves_out, out.full_tensor().contiguous(), group=dp_group)
    torch.distributed.all_gather(halves_gx, (xd.grad.full_tensor() / dp).contiguous(), group=dp_group)
    got["output"], got["grad x"] = torch.cat(halves_out), torch.cat(halves_gx)
    placements = {}
    for n, p in ep_model.named_parameters():
        got[f"grad {n}"] = p.grad.full_tensor()
        placements[n] = str(tuple(p.grad.placements))
    return _result(got, want, ep_model, placements, {}, {})

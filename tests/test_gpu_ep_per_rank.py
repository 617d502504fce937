"""GPU lane: the per-rank EP dispatch (``ep_routed_experts(..., dispatch="per_rank")``) on CUDA.

One rank process (``run_gloo(fn, 1)``) adds a 1-rank NCCL group; on one rank the all-to-alls are
copies, so the same step on CPU over gloo is the oracle, and what runs is the CUDA code path:

- output and every gradient (tokens, routing weights, the three expert weights) equal the CPU
  result within bf16 rounding (bf16 expert matmuls, other kernels' accumulation order);
- the step synchronizes the host with the device exactly as often as the per-expert step does
  (``torch.cuda.set_sync_debug_mode("warn")``: one warning per synchronizing call): the one copy of
  the split sizes to the host, nothing more in the forward or the backward.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

from dtensor_rules.testing import run_gloo
from tests._gpu import GPU

pytestmark = [*GPU, pytest.mark.slow]  # starts a rank process

DIM, HIDDEN, E, K, T = 16, 32, 4, 3, 13


def _step(x: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor, ws: list[torch.Tensor], group: Any,
          dispatch: str) -> tuple[list[torch.Tensor], int]:
    """Forward + backward; the outputs on the CPU and the synchronizing calls counted."""
    from dtensor_rules.ep.local import ep_routed_experts

    leaves = [t.detach().clone().requires_grad_() for t in (x, weights, *ws)]
    cuda = x.is_cuda
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if cuda:
            torch.cuda.set_sync_debug_mode("warn")
        try:
            out = ep_routed_experts(leaves[0], idx, *leaves[1:], n_experts=E, alignment=8, group=group,
                                    gmm_dtype=torch.bfloat16, dispatch=dispatch)
            out.pow(2).sum().backward()
        finally:
            if cuda:
                torch.cuda.set_sync_debug_mode("default")
    syncs = sum("synchroniz" in str(w.message) for w in caught)
    return [out.detach().cpu(), *(t.grad.cpu() for t in leaves)], syncs


def _worker(rank: int, world: int) -> dict[str, Any]:
    import torch.distributed as dist

    import dtensor_rules  # noqa: F401  (a fresh process: install the rules)

    torch.cuda.set_device(0)
    gloo, nccl = dist.group.WORLD, dist.new_group([0], backend="nccl")
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(T, DIM, generator=gen)
    idx = torch.rand(T, E, generator=gen).topk(K, dim=-1).indices
    idx[:4] = torch.tensor([3, 1, 2])
    weights = torch.rand(T, K, generator=gen)
    ws = [torch.randn(E, DIM, HIDDEN, generator=gen), torch.randn(E, DIM, HIDDEN, generator=gen),
          torch.randn(E, HIDDEN, DIM, generator=gen)]
    cuda = torch.device("cuda")
    on_cuda = (x.to(cuda), idx.to(cuda), weights.to(cuda), [w.to(cuda) for w in ws])
    want, _ = _step(x, idx, weights, ws, gloo, "per_rank")
    _step(*on_cuda, nccl, "per_rank")  # warm-up: first-call allocations and lazy inits are not the step's
    got, syncs = _step(*on_cuda, nccl, "per_rank")
    _step(*on_cuda, nccl, "per_expert")
    _, syncs_per_expert = _step(*on_cuda, nccl, "per_expert")
    names = ("output", "grad x", "grad weights", "grad w1", "grad w3", "grad w2")
    # bf16 expert matmuls, summed in another order on each device: 4 bf16 epsilons (2**-7) of the largest value
    wrong = [f"{n}: {(a - b).abs().max().item():.3g}" for n, a, b in zip(names, got, want)
             if not (a - b).abs().max().item() <= 2**-5 * (1 + b.abs().max().item())]
    return {"wrong": wrong, "syncs": (syncs, syncs_per_expert)}


def test_per_rank_dispatch_on_cuda_equals_cpu_and_syncs_once() -> None:
    (found,) = run_gloo(_worker, 1, timeout=300)
    assert not found["wrong"], found["wrong"]
    per_rank, per_expert = found["syncs"]
    # the split sizes' one copy to the host shows (the count works); per-rank adds none
    assert per_rank == per_expert >= 1, f"synchronizing calls: per_rank {per_rank}, per_expert {per_expert}"

"""GPU lane: the expert-parallel token moves on CUDA (a 1-rank NCCL group) against the same calls on CPU (gloo).

One rank process (``run_gloo(fn, 1)``: a default gloo group) adds a 1-rank NCCL group. On one rank the
all-to-all is a copy, which is what makes the CPU result the oracle; what runs is the CUDA code path:

- ``dtensor_rules::ep_dispatch`` / ``ep_combine`` on CUDA rows through ``opcheck`` (fake kernel,
  autograd registration, schema) and forward + backward, with the split sizes on the host (what
  ``ep_local.host_splits`` hands them: no sync inside the op) and on the device (the op reads them
  with ``tolist()``: one device-to-host sync per call), equal to the CPU (gloo) result bit for bit;
- ``ep_routed_experts`` on CUDA, the whole per-rank EP step (the counts all-to-all, the one
  ``.cpu()`` of the splits, ``moe_permute_indices`` on CUDA, i.e. the Triton kernel where triton is
  installed, ``_grouped_mm`` in bf16, the combine): output and every gradient equal the CPU (gloo)
  result within bf16 rounding (different ``_grouped_mm`` kernels accumulate in different orders).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from dtensor_rules.testing import run_gloo
from tests._gpu import GPU

pytestmark = [*GPU, pytest.mark.slow]  # starts a rank process

DIM, HIDDEN, E, K, T = 16, 32, 4, 2, 11


def _moves(x: torch.Tensor, cot: torch.Tensor, splits: torch.Tensor, group: str) -> list[torch.Tensor]:
    """dispatch, then combine of the received rows x 2; backward of (combined * cot).sum()."""
    from dtensor_rules.ep.all_to_all import ep_combine_op, ep_dispatch_op

    leaf = x.detach().clone().requires_grad_()
    received = ep_dispatch_op(leaf, splits, group)
    back = ep_combine_op(received * 2, splits, group, x.shape[0])
    (back * cot).sum().backward()
    return [t.detach().cpu() for t in (received, back, leaf.grad)]


def _routed(x: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor, ws: list[torch.Tensor],
            group: Any) -> list[torch.Tensor]:
    from dtensor_rules.ep.local import ep_routed_experts

    leaves = [t.detach().clone().requires_grad_() for t in (x, weights, *ws)]
    out = ep_routed_experts(leaves[0], idx, *leaves[1:], n_experts=E, alignment=8, group=group,
                            gmm_dtype=torch.bfloat16)
    out.pow(2).sum().backward()
    return [out.detach().cpu(), *(t.grad.cpu() for t in leaves)]


def _device_worker(rank: int, world: int, device: str = "cuda", backend: str = "nccl") -> dict[str, Any]:
    """The moves and the routed step on ``device`` over a 1-rank ``backend`` group vs on CPU over gloo."""
    import torch.distributed as dist

    import dtensor_rules  # noqa: F401  (a fresh process: install the rules)
    from dtensor_rules.ep.all_to_all import ep_combine_op, ep_dispatch_op

    if device == "cuda":
        torch.cuda.set_device(0)
    gloo = dist.group.WORLD
    nccl = dist.new_group([0], backend=backend)
    cuda = torch.device(device)
    gen = torch.Generator().manual_seed(0)
    x, cot = torch.randn(T, DIM, generator=gen), torch.randn(T, DIM, generator=gen)
    splits = torch.tensor([[T], [T]])  # one rank: every row to itself
    found: dict[str, Any] = {}

    x_cuda = x.to(cuda).clone().requires_grad_()
    torch.library.opcheck(ep_dispatch_op, (x_cuda, splits, nccl.group_name))
    torch.library.opcheck(ep_combine_op, (x_cuda, splits, nccl.group_name, T))
    want = _moves(x, cot, splits, gloo.group_name)
    for name, s in (("host splits", splits), ("device splits", splits.to(cuda))):
        got = _moves(x.to(cuda), cot.to(cuda), s, nccl.group_name)
        found[name] = [n for n, a, b in zip(("received", "combined", "grad x"), got, want) if not torch.equal(a, b)]

    idx = torch.randn(T, E, generator=gen).topk(K, dim=-1).indices
    idx[:3] = torch.tensor([3, 1])  # some rows share experts; expert 0 may be empty
    weights = torch.rand(T, K, generator=gen)
    ws = [torch.randn(E, DIM, HIDDEN, generator=gen), torch.randn(E, DIM, HIDDEN, generator=gen),
          torch.randn(E, HIDDEN, DIM, generator=gen)]
    want = _routed(x, idx, weights, ws, gloo)
    got = _routed(x.to(cuda), idx.to(cuda), weights.to(cuda), [w.to(cuda) for w in ws], nccl)
    names = ("output", "grad x", "grad weights", "grad w1", "grad w3", "grad w2")
    # bf16 expert matmuls, summed in another order on each device: 4 bf16 epsilons (2**-7) of the largest value
    found["routed"] = [f"{n}: {(a - b).abs().max().item():.3g}" for n, a, b in zip(names, got, want)
                       if not (a - b).abs().max().item() <= 2**-5 * (1 + b.abs().max().item())]
    return found


def test_ep_moves_and_the_routed_step_on_cuda_equal_cpu() -> None:
    (found,) = run_gloo(_device_worker, 1, timeout=300)
    assert found == {"host splits": [], "device splits": [], "routed": []}, found

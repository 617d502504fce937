"""Demo section 6: the MoE block expert parallel (``expert_parallel``) on the simulated mesh.

Shows where each parameter and its gradient live (placements and the per-rank shard),
the collectives one forward+backward runs (``CommBytesMode``: ``CommDebugMode`` plus
bytes), next to the ``shard_moe`` gather path's collectives on the same mesh, and checks
that the output and every gradient equal one device. Everything printed is
deterministic, so ``tests/test_demo.py`` pins it with ``expecttest``.
"""

from __future__ import annotations

import copy
from typing import NamedTuple, TextIO

import torch

from dtensor_rules.cli.ui import header, table

__all__ = ["section_expert_parallel", "EPStep"]


class EPStep(NamedTuple):
    """One forward+backward on the mesh: per-phase collective calls/bytes and the tensors to compare."""

    calls: dict[str, dict[str, int]]
    bytes: dict[str, dict[str, int]]
    got: list[torch.Tensor]  # output, grad x, grads of the parameters (full tensors, every rank's copy)


def _rank0(t: torch.Tensor) -> torch.Tensor:
    local = getattr(t, "_local_tensors", None)
    return local[min(local)] if local is not None else t


def _copies(t: torch.Tensor) -> list[torch.Tensor]:
    local = getattr(t, "_local_tensors", None)
    return [local[r] for r in sorted(local)] if local is not None else [t]


def _step(model: torch.nn.Module, x: torch.Tensor, cot: torch.Tensor, mesh, place) -> EPStep:  # type: ignore[no-untyped-def]
    from torch.distributed.tensor import distribute_tensor

    from dtensor_rules.testing.comm import CommBytesMode

    xd = distribute_tensor(x, mesh, place).requires_grad_()
    cotd = distribute_tensor(cot, mesh, place)
    with CommBytesMode() as comm:
        (model(xd) * cotd).sum().backward()
    out = model(xd).detach()
    got = [out.full_tensor(), xd.grad.full_tensor(), *(p.grad.full_tensor() for p in model.parameters())]
    return EPStep({k: dict(v) for k, v in comm.calls.items()}, {k: dict(v) for k, v in comm.bytes.items()}, got)


def _layout(t: torch.Tensor) -> tuple[str, str]:
    """(placements, rank 0's local shape) of a DTensor."""
    short = {"Shard": "S", "Replicate": "R", "Partial": "P"}
    names = []
    for p in t.placements:
        n = type(p).__name__
        names.append(f"{short.get(n, n)}({p.dim})" if hasattr(p, "dim") else short.get(n, n))
    return ", ".join(names), "x".join(map(str, _rank0(t.to_local()).shape))


def section_expert_parallel(mesh_shape: tuple[int, ...], out: TextIO) -> bool:
    """Run the EP step and the gather-path step on a simulated mesh; print layouts and collectives."""
    from dtensor_rules.cli.demo_model import demo_inputs, demo_model, within_tolerance
    from dtensor_rules.ep import expert_parallel, token_placements
    from dtensor_rules.models import shard_moe
    from dtensor_rules.testing import simulated_mesh

    header("6. expert parallel: tokens by all-to-all, experts never gathered", out)
    dtype = torch.float32
    x, cot = demo_inputs(dtype)
    x = x.reshape(-1, x.shape[-1])
    cot = cot.reshape(-1, cot.shape[-1])
    reference = demo_model(dtype)
    xr = x.clone().requires_grad_()
    o = reference(xr)
    want = [o.detach(), *torch.autograd.grad((o * cot).sum(), [xr, *reference.parameters()])]
    names = ["output", "grad x", *[f"grad {n}" for n, _ in reference.named_parameters()]]
    with simulated_mesh(mesh_shape, names=("ep", "tp")) as mesh:
        place = token_placements(mesh)
        ep_model = expert_parallel(copy.deepcopy(reference), mesh)
        ep = _step(ep_model, x, cot, mesh, place)
        rows = []
        for n, p in ep_model.named_parameters():
            (pp, ps), (gp, gs) = _layout(p), _layout(p.grad)
            rows.append((n, "x".join(map(str, p.shape)), pp, ps, gp, gs))
        gather = _step(shard_moe(copy.deepcopy(reference), mesh), x, cot, mesh, place)
    print(f"expert_parallel(model, mesh): mesh {'x'.join(map(str, mesh_shape))} ('ep', 'tp'), "
          f"{x.shape[0]} tokens Shard(0) on ep, Replicate on tp", file=out)
    print(table(rows, ("parameter", "shape", "placements", "rank 0 holds", "grad placements", "grad rank 0 holds")), file=out)

    print("\ncollectives of one forward+backward (rank 0; bytes = larger of input and output per call):", file=out)
    body = []
    for label, step in (("expert parallel", ep), ("shard_moe gather path", gather)):
        for phase in ("forward", "backward"):
            for name in sorted(step.calls[phase]):
                body.append((label, phase, name, step.calls[phase][name], step.bytes[phase][name]))
    print(table(body, ("path", "phase", "collective", "calls", "bytes"), right=(3, 4)), file=out)

    ok_values = all(within_tolerance(c, w, dtype) for g, w in zip(ep.got, want) for c in _copies(g))
    no_gather = all("all_gather" not in ep.calls[p] for p in ("forward", "backward"))
    sharded = all(r[2] == r[4] for r in rows if r[0] in ("w1", "w3", "w2"))
    print(f"\nexpert parallel = single device (output and {len(names) - 1} gradients, float32 1e-5): "
          f"{'yes' if ok_values else 'NO'}", file=out)
    print(f"no all_gather in forward or backward: {'yes' if no_gather else 'NO'}", file=out)
    print(f"expert gradients stay sharded like their weights: {'yes' if sharded else 'NO'}", file=out)
    return ok_values and no_gather and sharded

"""The routing x token-count sweep of ``expert_parallel``: cases, the one-device oracle, the comparison.

Shared by the eager sweep on a simulated mesh (``tests/test_ep_sweep.py``) and the compiled one on
real gloo ranks (``tests/test_ep_compile_sweep.py``, whose rank function lives here so ``run_gloo``
can pickle it). The oracle is the same ``MoE`` block on one device, plain torch: its output and the
gradients of the tokens and of every parameter for the loss ``(out * cot).sum()``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import torch

from dtensor_rules.models import MoE, MoEConfig

E, DIM, HIDDEN = 4, 8, 16  # 4 experts: 2 per rank on ep=2, 1 per rank on ep=4

# expert_bias steers the top-k selection only (the combine weights stay unbiased)
ROUTINGS: dict[str, tuple[float, ...]] = {
    "random": (0.0, 0.0, 0.0, 0.0),
    "all_to_one": (0.0, 0.0, 0.0, 10.0),  # top-1: every token to expert 3, the last ep rank's
    "empty_expert": (0.0, -10.0, 0.0, 0.0),  # expert 1 never chosen while k < E
    "empty_rank": (-10.0, -10.0, 0.0, 0.0),  # k <= 2 on ep=2: ep rank 0 receives no row at all
}


class Call(NamedTuple):
    """One forward + backward: ``tokens`` in all (uneven over the ranks where odd), the routing's name."""

    tokens: int
    routing: str


def reference(top_k: int, gmm_dtype: torch.dtype | None = None) -> MoE:
    """The one-device block (a shared expert included), seeded weights."""
    m = MoE(MoEConfig(dim=DIM, hidden=HIDDEN, n_experts=E, top_k=top_k, gmm_dtype=gmm_dtype))
    m.init_weights(2)
    return m


def data(tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, cotangent) for ``tokens`` rows, seeded by the count."""
    g = torch.Generator().manual_seed(100 + tokens)
    return torch.randn(tokens, DIM, generator=g), torch.randn(tokens, DIM, generator=g)


def oracle(ref: MoE, x: torch.Tensor, cot: torch.Tensor) -> dict[str, torch.Tensor]:
    """Output, token gradient and every parameter's gradient of ``(ref(x) * cot).sum()``, one device."""
    ref.zero_grad(set_to_none=True)
    xr = x.clone().requires_grad_()
    out = ref(xr)
    (out * cot).sum().backward()
    want = {"output": out.detach(), "grad x": xr.grad}
    for n, p in ref.named_parameters():
        want[f"grad {n}"] = p.grad if p.grad is not None else torch.zeros_like(p)
    return want


def expert_counts(ref: MoE, x: torch.Tensor) -> list[int]:
    """Assignments per expert (one device): the routing the case promises, checked by the tests."""
    return torch.bincount(ref.route(x)[0].reshape(-1), minlength=E).tolist()


def promised(calls: tuple[Call, ...], top_k: int, counts: list[list[int]]) -> list[str]:
    """Where a call's one-device routing is not the one its name promises (only while k leaves room)."""
    wrong = []
    for c, n in zip(calls, counts):
        if c.routing == "all_to_one" and n[E - 1] != c.tokens:
            wrong.append(f"{c}: expert {E - 1} got {n[E - 1]} of {c.tokens} tokens")
        if top_k == 1 and c.routing == "all_to_one" and sum(n[: E - 1]):
            wrong.append(f"{c}: top-1 sent tokens elsewhere: {n}")
        if c.routing == "empty_expert" and top_k < E and n[1]:
            wrong.append(f"{c}: expert 1 got {n[1]}")
        if c.routing == "empty_rank" and top_k <= 2 and n[0] + n[1]:
            wrong.append(f"{c}: experts 0, 1 got {n[:2]}")
        if sum(n) != c.tokens * top_k:
            wrong.append(f"{c}: {sum(n)} assignments for {c.tokens} tokens x top-{top_k}")
    return wrong


def problems(what: str, got: dict[str, Iterable[torch.Tensor]], want: dict[str, torch.Tensor],
             rel: float = 1e-5) -> list[str]:
    """Each ``got[name]`` (one full tensor per rank) within ``rel * (1 + max|want|)`` of ``want[name]``."""
    out = []
    for name, expected in want.items():
        tol = rel * (1 + (expected.abs().max().item() if expected.numel() else 0.0))
        for rank, t in enumerate(got[name]):
            if t.shape != expected.shape:
                out.append(f"{what}, {name}, rank {rank}: shape {tuple(t.shape)} != {tuple(expected.shape)}")
                continue
            err = (t.float() - expected.float()).abs().max().item() if t.numel() else 0.0
            if not err <= tol:
                out.append(f"{what}, {name}, rank {rank}: max error {err:.3g} > {tol:.3g}")
    return out


def run_calls(block: Callable[[Any], Any], model: MoE, ref: MoE, mesh: Any, calls: Iterable[Call],
              full: Callable[[torch.Tensor], list[torch.Tensor]],
              tp_dim: str | None = None) -> tuple[list[str], list[list[int]]]:
    """Run ``block`` (``model`` or its compiled form) per call; compare with ``ref`` on one device.

    ``full(t)``: every rank's copy of a full tensor (simulated: one per rank; gloo: this rank's).
    Returns the problems and, per call, the one-device expert counts.
    """
    from torch.distributed.tensor import distribute_tensor

    from dtensor_rules.ep import token_placements

    place = token_placements(mesh, tp_dim=tp_dim)
    found: list[str] = []
    counts: list[list[int]] = []
    for c in calls:
        bias = torch.tensor(ROUTINGS[c.routing])
        ref.expert_bias.copy_(bias)
        with torch.no_grad():
            model.expert_bias.to_local().copy_(bias)  # a buffer: a new value, no recompile
        x, cot = data(c.tokens)
        want = oracle(ref, x, cot)
        counts.append(expert_counts(ref, x))
        model.zero_grad(set_to_none=True)
        xd = distribute_tensor(x, mesh, place).requires_grad_()
        out = block(xd)
        (out * distribute_tensor(cot, mesh, place)).sum().backward()
        got = {"output": full(out.full_tensor()), "grad x": full(xd.grad.full_tensor())}
        for n, p in model.named_parameters():
            got[f"grad {n}"] = full(p.grad.full_tensor()) if p.grad is not None else [torch.zeros(p.shape)]
        found += problems(f"{c.tokens} tokens, {c.routing}", got, want)
    return found, counts


def deep_ep_copy(ref: MoE, mesh: Any, tp_dim: str | None = None, dispatch: str = "per_expert") -> MoE:
    """``expert_parallel`` on a copy of ``ref`` (the oracle keeps its own parameters)."""
    from dtensor_rules.ep import expert_parallel

    return expert_parallel(copy.deepcopy(ref), mesh, tp_dim=tp_dim, dispatch=dispatch)


def compiled_sweep_worker(rank: int, world: int, plan: list[tuple[str, int, list[Call]]],
                          dispatch: str = "per_expert") -> dict[str, Any]:
    """ep = ``world`` gloo ranks; per (backend, top_k, calls) of ``plan``: ONE ``torch.compile(dynamic=True)``
    of the ``expert_parallel`` block, called per call, each against the block on one device.

    The expert matmuls run in bf16 in both (``gmm_dtype``: the CPU ``_grouped_mm`` compiled code runs
    accepts only bf16); ``inductor`` with ``emulate_precision_casts`` (it rounds bf16 intermediates
    where eager does). Also returns ``upstream_stale_shape``: whether plain ``x * 2`` compiled for a
    DTensor of 0 rows in all still returns a 0-row DTensor on rank 1 for a 1-row input (the upstream
    defect ``_upstream/static_shards.py`` guards against in the EP region), and per (backend, top_k)
    ``graphs``: (Dynamo's unique graphs, graph breaks). ``dispatch``: ``expert_parallel``'s.
    """
    import logging
    import warnings

    import torch._inductor.config
    from torch._dynamo.utils import counters
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    import dtensor_rules  # noqa: F401  (a fresh process: install the rules)

    warnings.simplefilter("ignore")
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("ep",))
    results: dict[str, Any] = {}
    for backend, top_k, calls in plan:
        torch._dynamo.reset()
        counters.clear()
        ref = reference(top_k, torch.bfloat16)
        model = deep_ep_copy(ref, mesh, dispatch=dispatch)
        compiled = torch.compile(model, backend=backend, dynamic=True)
        with torch._inductor.config.patch(emulate_precision_casts=True):
            found, counts = run_calls(compiled, model, ref, mesh, calls, lambda t: [t])
        graphs = (counters["stats"]["unique_graphs"], sum(counters["graph_break"].values()))
        results[f"{backend} top-{top_k}"] = {"problems": found, "counts": counts, "graphs": graphs}
    torch._dynamo.reset()
    twice = torch.compile(lambda x: x * 2, backend="aot_eager", dynamic=True)
    shapes = [tuple(twice(distribute_tensor(torch.ones(n, 2), mesh, [Shard(0)])).shape) for n in (0, 1)]
    results["upstream_stale_shape"] = shapes[1] != (1, 2)
    return results

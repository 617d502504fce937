"""The solver's expert-parallel choice, applied through ``expert_parallel`` and compiled.

4 gloo ranks on a (2, 2) mesh, the layout the solver chose on the DeepSeek-V2-Lite-like layer
(docs/solver.md): ep on mesh dim 1, expert TP on dim 0, the shared expert as chosen, tokens
data parallel (``Shard(0)`` on both dims). ``place_choice(..., ep=True)`` then
``torch.compile(backend="aot_eager", dynamic=True)``, called with two token counts, forward and
backward (output, token and every parameter gradient).

Oracles: the same choice run eagerly (a second block placed the same way; aot_eager changes no
arithmetic, so within 1e-6 relative), and the block on one device, plain torch. The expert
matmuls are bf16 in all three (the CPU ``_grouped_mm`` meta kernel compiled code runs accepts
only bf16), and expert TP rounds each tp rank's hidden slice of ``w2``'s product to bf16 before
the sum over tp where one device rounds the whole sum once: against one device the bound is
``tests/_ep_workers.bound``'s bf16 one (4 bf16 ulps of the largest value).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from dtensor_rules.testing import run_gloo

pytestmark = pytest.mark.slow  # starts processes and compiles (see pyproject.toml)

DIM = 16
TOKENS = (21, 34)  # every ep rank holds more than one token row (one row per rank: tests/test_ep_compile.py)


def _worker(rank: int, world: int) -> dict[str, Any]:
    import logging
    import warnings

    warnings.simplefilter("ignore")
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    import dtensor_rules  # noqa: F401  (fresh process: install the rules)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from dtensor_rules.models import MoE, MoEConfig
    from dtensor_rules.solver import place_choice

    R = Replicate()
    chosen = {"gate": (R, R), "w1": (Shard(2), Shard(0)), "w3": (Shard(2), Shard(0)), "w2": (Shard(1), Shard(0)),
              "shared_w1": (R, Shard(0)), "shared_w3": (Shard(1), R), "shared_w2": (R, R)}
    tokens = (Shard(0), Shard(0))
    config = MoEConfig(dim=DIM, hidden=32, n_experts=4, top_k=2, gmm_dtype=torch.bfloat16)
    reference = MoE(config)
    mesh = init_device_mesh("cpu", (2, 2))
    model = place_choice(MoE(config), mesh, chosen, ep=True)
    eager = place_choice(MoE(config), mesh, chosen, ep=True)
    compiled = torch.compile(model, backend="aot_eager", dynamic=True)
    errors: dict[str, tuple[float, float]] = {}  # (vs eager EP, vs one device), each over 1 + max|value|
    for n in TOKENS:
        gen = torch.Generator().manual_seed(n)
        x, cot = torch.randn(n, DIM, generator=gen), torch.randn(n, DIM, generator=gen)
        runs = []
        for block in (compiled, eager):
            xd = distribute_tensor(x, mesh, tokens).requires_grad_()
            out = block(xd)
            (out * distribute_tensor(cot, mesh, (R, R))).sum().backward()
            params = model if block is compiled else eager
            runs.append([out.full_tensor(), xd.grad.full_tensor(), *(p.grad.full_tensor() for p in params.parameters())])
        xr = x.clone().requires_grad_()
        want = reference(xr)
        (want * cot).sum().backward()
        one = [want.detach(), xr.grad, *(p.grad for p in reference.parameters())]
        names = ["output", "grad x", *(f"grad {k}" for k, _ in reference.named_parameters())]
        for name, got, same, exp in zip(names, *runs, one):
            errors[f"{n} tokens, {name}"] = ((got - same).abs().max().item() / (1 + same.abs().max().item()),
                                             (got - exp).abs().max().item() / (1 + exp.abs().max().item()))
        for m in (model, eager, reference):
            m.zero_grad(set_to_none=True)
    placements = {w: str(tuple(model.get_parameter(w).placements)) for w in ("w1", "w3", "w2")}
    return {"errors": errors, "placements": placements}


def test_the_solver_ep_choice_compiled_equals_one_device() -> None:
    results = run_gloo(_worker, 4, timeout=900)
    for rank, r in enumerate(results):
        bad = {k: v for k, v in r["errors"].items() if not (v[0] <= 1e-6 and v[1] <= 4 * 2**-7)}
        assert not bad, f"rank {rank}: (vs eager, vs one device) {bad}"
        assert len(r["errors"]) == 2 * (2 + 7), r["errors"]  # output, grad x, 7 parameters; per call
        assert r["placements"] == {"w1": "(Shard(dim=2), Shard(dim=0))", "w3": "(Shard(dim=2), Shard(dim=0))",
                                   "w2": "(Shard(dim=1), Shard(dim=0))"}, r["placements"]

"""The MoE block under ``torch.compile(backend="aot_eager", dynamic=True)`` on DTensor inputs.

Real gloo ranks on a 2x2 ("ep", "tp") mesh, the gather path (:func:`shard_moe`), experts in bf16
(the ``_grouped_mm`` meta kernel, which compiled code runs on fake tensors, accepts only bf16).
Token counts change from call to call, as MoE batches do: backed sizes must reuse one graph,
and an unbacked (data-dependent) token count must compile once for every count, including
counts the "ep" ranks cannot split evenly (33 -> 17/16) and a single token (1/0).

Oracle: the same block on one device, plain torch: the output and every parameter's gradient.

What this guards: without the ``first_symbol_record`` patch (``_upstream/tracing.py``) the
joint-graph trace dies with ``RecursionError`` (upstream's rules too, torch 2.13 and 2.14);
without ``MoE.flat_assignments`` an uneven or unbacked token count is refused by DTensor's view
rule; without symbolic bounds in ``moe_permute_indices`` the kernel path guards on an unbacked size.
"""

from __future__ import annotations

import pytest
import torch

from dtensor_rules.testing import run_gloo

pytestmark = pytest.mark.slow  # see pyproject.toml

DIM = 16


def _config(permute_impl: str):
    from dtensor_rules.models import MoEConfig

    return MoEConfig(dim=DIM, hidden=32, n_experts=4, top_k=2, gmm_dtype=torch.bfloat16, permute_impl=permute_impl)


def _compile_worker(rank: int, world: int, permute_impl: str, unbacked: bool,
                    token_shapes: tuple[tuple[int, ...], ...]) -> list[str]:
    """Per token shape: compiled sharded forward+backward vs the single-device block; then the graph count."""
    import dtensor_rules  # noqa: F401  (spawned process: install the rules)
    from torch._dynamo.utils import counters
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from dtensor_rules.models import MoE, shard_moe

    torch._dynamo.reset()
    counters.clear()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("ep", "tp"))
    reference = MoE(_config(permute_impl))
    reference.init_weights(0)
    model = MoE(_config(permute_impl))
    model.init_weights(0)
    compiled = torch.compile(shard_moe(model, mesh), backend="aot_eager", dynamic=True)
    names = [n for n, _ in reference.named_parameters()]
    problems = []
    for shape in token_shapes:
        x = torch.randn(*shape, DIM, generator=torch.Generator().manual_seed(sum(shape)))
        xd = distribute_tensor(x, mesh, (Shard(0), Replicate()))
        if unbacked:
            torch._dynamo.decorators.mark_unbacked(xd, 0)
        out = compiled(xd)
        out.float().pow(2).mean().backward()
        want = reference(x)
        want.float().pow(2).mean().backward()
        pairs = [("output", out.full_tensor(), want.detach())]
        pairs += [(f"grad {n}", getattr(model, n).grad.full_tensor(), getattr(reference, n).grad) for n in names]
        for what, got, expected in pairs:
            # bf16 experts; the sharded run sums TP partials in another order: ~2 ulps of the largest value
            tol = 2 * 2**-7 * max(expected.abs().max().item(), 1e-3)
            if got.shape != expected.shape or not torch.allclose(got.float(), expected.float(), atol=tol, rtol=2e-2):
                err = (got.float() - expected.float()).abs().max().item() if got.shape == expected.shape else "shape"
                problems.append(f"tokens {shape}, {what}: max error {err} > {tol:.3g}")
        model.zero_grad(set_to_none=True)
        reference.zero_grad(set_to_none=True)
    graphs = counters["stats"]["unique_graphs"]
    if graphs != 1:
        problems.append(f"{graphs} graphs compiled for token shapes {token_shapes}, expected 1")
    return problems


# (permute_impl, unbacked, token shapes): each compiles once for all its shapes
REGIMES = {
    # one graph serves 20, 33 (uneven over 'ep') and 1 token(s); results equal one device (the torch
    # permute with these counts is docs/compile.md's recipe: tests/test_docs_scripts.py runs it)
    "unbacked counts, kernel permute": ("kernel", True, ((20,), (33,), (1,))),
    # ``dynamic=True`` with ordinary (backed) sizes: (batch, seq, dim) tokens, batch over 'ep'; a new
    # sequence length reuses the graph (this shape's final reshape is where the trace recursed
    # without ``first_symbol_record``)
    "backed (batch, seq) counts": ("torch", False, ((2, 10), (2, 18))),
}


def _regimes_worker(rank: int, world: int) -> dict[str, list[str]]:
    """Every regime in turn on one gloo world (``_compile_worker`` resets dynamo and its counters)."""
    return {name: _compile_worker(rank, world, *regime) for name, regime in REGIMES.items()}


def test_moe_block_compiles_once_for_every_token_regime() -> None:
    results = run_gloo(_regimes_worker, 4, timeout=1800)  # a hang guard: at load ~25 the three regimes took over 10 min
    problems = [f"rank {r}, {name}: {p}" for r, res in enumerate(results) for name, ps in res.items() for p in ps]
    assert [sorted(res) for res in results] == [sorted(REGIMES)] * 4
    assert not problems, "\n".join(problems)

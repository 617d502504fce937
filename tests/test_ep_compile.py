"""#20.4: the expert-parallel block (``expert_parallel``, all-to-all dispatch) under ``torch.compile(dynamic=True)``.

Real gloo ranks, ep = 2. The block is compiled ONCE and called with three token counts, each
uneven over the ranks (21 -> 11/10, 33 -> 17/16, 7 -> 4/3), and routings steered by
``expert_bias``: every expert used; expert 1 (ep rank 0's second expert) never chosen; experts 0
and 1 never chosen, so ep rank 0 receives no row at all. The per-expert counts are data-dependent:
compiled, the all-to-all split sizes are unbacked SymInts read by the one documented host copy
(``ep_local._host_splits``), so one graph serves every routing.

Oracle: the same block on one device, plain torch: the output and the gradients of the tokens
and of every parameter, within 1e-5 (fp32 parameters and tokens; the expert matmuls run in bf16 in
both, ``gmm_dtype``: on CPU the ``_grouped_mm`` meta kernel that compiled code runs accepts only bf16).

What this guards: without ``capture_scalar_outputs`` and the traceable split sizes, Dynamo breaks the
graph at the split sizes' ``tolist()`` (10 to 13 graphs per rank for three calls instead of one or two).
"""

from __future__ import annotations

import copy

import pytest
import torch

from dtensor_rules.testing import run_gloo

pytestmark = pytest.mark.slow  # see pyproject.toml

DIM = 16
# (tokens, expert_bias): the bias steers selection only (the combine weights stay unbiased)
CALLS = (
    (21, (0.0, 0.0, 0.0, 0.0)),
    (33, (0.0, -10.0, 0.0, 0.0)),  # expert 1 (ep rank 0) receives nothing
    (7, (-10.0, -10.0, 0.0, 0.0)),  # ep rank 0 receives no row at all
)


def _worker(rank: int, world: int, backend: str) -> dict:
    """Compiled EP forward+backward vs one device per call; then the graph and break counts."""
    import logging
    import warnings

    import dtensor_rules  # noqa: F401  (fresh process: install the rules)
    from torch._dynamo.utils import counters
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor

    from dtensor_rules.models import MoE, MoEConfig
    from dtensor_rules.models.expert_parallel import expert_parallel, token_placements

    warnings.simplefilter("ignore")
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    torch._dynamo.config.capture_scalar_outputs = True  # the recipe's one setting (docs/compile.md)
    torch._dynamo.reset()
    counters.clear()
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("ep",))
    reference = MoE(MoEConfig(dim=DIM, hidden=32, n_experts=4, top_k=2, gmm_dtype=torch.bfloat16))
    reference.init_weights(2)
    model = expert_parallel(copy.deepcopy(reference), mesh, tp_dim=None)
    compiled = torch.compile(model, backend=backend, dynamic=True)
    place = token_placements(mesh, tp_dim=None)
    problems: list[str] = []
    expert_counts: list[list[int]] = []
    for n, bias in CALLS:
        reference.expert_bias.copy_(torch.tensor(bias))
        model.expert_bias.to_local().copy_(torch.tensor(bias))
        gen = torch.Generator().manual_seed(n)
        x, cot = torch.randn(n, DIM, generator=gen), torch.randn(n, DIM, generator=gen)
        xd = distribute_tensor(x, mesh, place).requires_grad_()
        out = compiled(xd)
        (out * distribute_tensor(cot, mesh, place)).sum().backward()
        xr = x.clone().requires_grad_()
        want = reference(xr)
        (want * cot).sum().backward()
        expert_counts.append(torch.bincount(reference.route(x)[0].reshape(-1), minlength=4).tolist())
        pairs = [("output", out.full_tensor(), want.detach()), ("grad x", xd.grad.full_tensor(), xr.grad)]
        pairs += [(f"grad {name}", p.grad.full_tensor(), reference.get_parameter(name).grad)
                  for name, p in model.named_parameters()]
        for what, got, expected in pairs:
            tol = 1e-5 + 1e-5 * expected.abs().max().item()
            err = (got - expected).abs().max().item() if got.shape == expected.shape else float("inf")
            if not err <= tol:
                problems.append(f"{n} tokens, {what}: max error {err:.3g} > {tol:.3g}")
        model.zero_grad(set_to_none=True)
        reference.zero_grad(set_to_none=True)
    return {"problems": problems, "expert_counts": expert_counts, "graphs": counters["stats"]["unique_graphs"],
            "graph_breaks": sum(counters["graph_break"].values())}


@pytest.mark.parametrize("backend", ["aot_eager"])
def test_ep_block_compiles_to_one_graph_and_equals_one_device(backend: str) -> None:
    results = run_gloo(_worker, 2, backend, timeout=600)
    for rank, r in enumerate(results):
        # the routings the cases promise: expert 1 empty in the second call, experts 0 and 1 in the third
        assert r["expert_counts"][1][1] == 0 and r["expert_counts"][2][:2] == [0, 0], r["expert_counts"]
        assert not r["problems"], f"rank {rank}:\n" + "\n".join(r["problems"])
        assert (r["graphs"], r["graph_breaks"]) == (1, 0), f"rank {rank}: {r['graphs']} graphs, {r['graph_breaks']} breaks"

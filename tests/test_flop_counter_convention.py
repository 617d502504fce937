"""What ``import dtensor_rules`` adds to FlopCounterMode follows torch's convention.

FlopCounterMode counts floating matrix-engine work only; tools divide its totals by a per-dtype
TFLOP/s table. After the import: integer sorting/scanning/scatters count 0 there (their cost stays
in ``dtensor_rules.costs.estimate``), ``_grouped_mm`` counts 2*m*k*n per group (hand-counted
here), and an AutoParallel-style estimator over every node of the MoE block's traced
forward+backward never meets a dtype its rate table lacks.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import dtensor_rules  # noqa: F401  (installs rules and default patches)
from dtensor_rules.costs import estimate

aten = torch.ops.aten


def counted(fn) -> int:  # noqa: ANN001
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


INT_IDS = torch.randint(0, 64, (512,), generator=torch.Generator().manual_seed(0))
INT_CALLS = {
    "sort.stable": (aten.sort.stable, lambda: (INT_IDS,), {"stable": True}),
    "argsort.stable": (aten.argsort.stable, lambda: (INT_IDS,), {"stable": True}),
    "cumsum": (aten.cumsum.default, lambda: (INT_IDS, 0), {}),
    "scatter_add": (aten.scatter_add.default, lambda: (torch.zeros(64, dtype=torch.int64), 0, INT_IDS, torch.ones_like(INT_IDS)), {}),
    "scatter_reduce": (aten.scatter_reduce.two, lambda: (torch.zeros(64, dtype=torch.int64), 0, INT_IDS, INT_IDS, "amax"), {}),
    "index_put accumulate": (aten.index_put.default, lambda: (torch.zeros(64, dtype=torch.int64), [INT_IDS], torch.ones_like(INT_IDS), True), {}),
    "bincount": (aten.bincount.default, lambda: (INT_IDS,), {}),
    "topk": (aten.topk.default, lambda: (INT_IDS, 8), {}),
}


@pytest.mark.parametrize("name", sorted(INT_CALLS))
def test_integer_ops_count_zero_in_flop_counter_mode_but_keep_their_cost(name: str) -> None:
    op, make_args, kwargs = INT_CALLS[name]
    args = make_args()
    assert counted(lambda: op(*args, **kwargs)) == 0
    cost = estimate(op, *args, **kwargs)  # our own cost API still prices the work
    assert cost.flops > 0 and cost.bytes > 0, cost


def test_float_sorting_and_scans_stay_at_torchs_zero_too() -> None:
    x = torch.randn(8, 16)
    assert counted(lambda: (torch.sort(x, dim=1, stable=True), torch.cumsum(x, 1), torch.histc(x, 4))) == 0


def test_only_grouped_mm_is_added_and_torchs_entries_are_untouched() -> None:
    from torch.utils import flop_counter as fc

    from dtensor_rules.costs.flop_counter import registered_flop_formulas

    assert registered_flop_formulas() == [aten._grouped_mm]
    ours = {p for p, fn in fc.flop_registry.items() if getattr(fn, "__name__", "").startswith("dtensor_rules_")}
    assert ours == {aten._grouped_mm}
    assert fc.flop_registry[aten.mm] is fc.mm_flop


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_mm_counts_two_m_k_n_per_group(dtype: torch.dtype) -> None:
    K, N, sizes = 16, 8, [5, 0, 7, 3]  # strides a multiple of 16 bytes; an empty group counts nothing
    a = torch.randn(sum(sizes), K, dtype=dtype)
    b = torch.randn(len(sizes), K, N, dtype=dtype)
    offs = torch.tensor(sizes, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    by_hand = 0
    for m in sizes:
        by_hand += 2 * m * K * N
    assert by_hand == 2 * 15 * 16 * 8
    assert counted(lambda: torch._grouped_mm(a, b, offs=offs)) == by_hand
    a3 = torch.randn(3, 4, K, dtype=dtype)
    b3 = torch.randn(3, K, N, dtype=dtype)
    assert counted(lambda: torch._grouped_mm(a3, b3)) == 3 * 2 * 4 * K * N


# per-dtype dense GEMM rates (TFLOP/s), H100-like; no integer-wide or bool entry, as in
# AutoParallel's compute estimator (autoparallel/cost_models/compute_estimation.py)
RATES = {torch.float64: 67, torch.float32: 494, torch.float16: 989, torch.bfloat16: 989, torch.int8: 1979}


def estimator_runtime_us(node: torch.fx.Node) -> float:
    """AutoParallel's recipe: FlopCounterMode over the node's op on its traced values; a node with
    flops is priced by its first tensor argument's dtype, and an unknown dtype is a ValueError."""
    from torch.utils._pytree import tree_leaves, tree_map_only

    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload) or node.target.is_view:
        return 0.0
    args = tree_map_only(torch.fx.Node, lambda n: n.meta["val"], node.args)
    kwargs = tree_map_only(torch.fx.Node, lambda n: n.meta["val"], node.kwargs)
    with FlopCounterMode(display=False) as counter:
        node.target(*args, **kwargs)
    flops = counter.get_total_flops()
    if flops == 0:
        return 7.0
    dtype = next(x.dtype for x in tree_leaves(args) if isinstance(x, torch.Tensor))
    if dtype not in RATES:
        raise ValueError(f"Dtype {dtype} not supported on H100 ({node.target})")
    return flops / (RATES[dtype] * 1e12) * 1e6


@pytest.mark.parametrize("permute_impl", ["torch", "kernel"])
def test_autoparallel_style_estimator_prices_every_node_of_the_moe_joint_graph(permute_impl: str) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    from dtensor_rules.models import MoE, MoEConfig

    model = MoE(MoEConfig(dim=16, hidden=32, n_experts=4, top_k=2, gmm_dtype=torch.bfloat16, permute_impl=permute_impl))
    model.init_weights(0)
    names = [n for n, _ in model.named_parameters()]
    buffer_names = [n for n, _ in model.named_buffers()]
    n_state = len(names) + len(buffer_names)

    def joint(*flat: torch.Tensor):  # noqa: ANN202
        state, x, cot = flat[:n_state], flat[-2], flat[-1]
        out = torch.func.functional_call(model, dict(zip([*names, *buffer_names], state)), (x,))
        return out, torch.autograd.grad(out, [*state[: len(names)], x], cot, allow_unused=True)

    x = torch.randn(24, 16, requires_grad=True)
    params = [p.detach().requires_grad_() for p in model.parameters()]
    buffers = [b.detach() for b in model.buffers()]
    graph = make_fx(joint, tracing_mode="fake")(*params, *buffers, x, torch.ones(24, 16))
    nodes = [n for n in graph.graph.nodes if n.op == "call_function"]
    targets = {str(n.target) for n in nodes}
    # the ops AutoParallel tripped on (int64 sort of expert ids) and the expert matmuls
    assert {"aten._grouped_mm.default", "aten.sort.stable", "aten.scatter_add.default"} <= targets, targets
    mode = next(n.meta["val"].fake_mode for n in nodes if isinstance(n.meta.get("val"), torch.Tensor))
    assert isinstance(mode, FakeTensorMode)
    with mode:
        times = {n.name: estimator_runtime_us(n) for n in nodes}  # must not raise
    gmm = [n.name for n in nodes if n.target is aten._grouped_mm.default]
    assert gmm and all(times[g] > 0 for g in gmm)
    ints = [n for n in nodes if isinstance(n.meta.get("val"), torch.Tensor) and not n.meta["val"].is_floating_point()]
    assert ints  # the routing's integer ops are in the graph and priced as memory traffic

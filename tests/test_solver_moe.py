"""The placement solver (dtensor_rules.solver) on small cases: its choice is consistent and
optimal, respects the memory cap, and the chosen placements run and equal one device."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

import dtensor_rules
from dtensor_rules._upstream import per_rank_copies
from dtensor_rules.models.moe import MoE, MoEConfig
from dtensor_rules.solver import apply_choice, build_problem, choose_placements, query_graph, solve, trace_joint
from dtensor_rules.solver.price import Pricer
from dtensor_rules.testing import fake_world, simulated_mesh

# bf16 experts: the CPU meta kernel of _grouped_mm (what fake tracing runs) is bf16-only
TRACE = MoEConfig(dim=16, hidden=32, n_experts=4, top_k=2, gmm_dtype=torch.bfloat16)
RUN = MoEConfig(dim=16, hidden=32, n_experts=4, top_k=2)  # the same block in fp32 for the oracle
TOKENS = 32


def _param_bytes(module: nn.Module, layouts: dict, mesh_shape: tuple[int, ...]) -> int:
    """Rank 0's parameter bytes, from the layouts alone (ceil division per sharded dim)."""
    total = 0
    for name, p in module.named_parameters():
        shape = list(p.shape)
        for size, pl in zip(mesh_shape, layouts[name]):
            if isinstance(pl, Shard):
                shape[pl.dim] = -(-shape[pl.dim] // size)
        total += math.prod(shape) * p.dtype.itemsize
    return total


@pytest.fixture(scope="module")
def joint():
    model = MoE(TRACE)
    return model, trace_joint(model, torch.randn(TOKENS, TRACE.dim))


def test_tight_memory_cap_forces_sharded_experts_and_the_choice_runs(joint) -> None:
    model, jg = joint
    with fake_world(4):
        mesh = init_device_mesh("cpu", (4,))
        free = choose_placements(model, None, mesh, joint=jg)
        replicated = _param_bytes(model, {n: (Replicate(),) for n, _ in model.named_parameters()}, (4,))
        cap = replicated // 2
        tight = choose_placements(model, None, mesh, joint=jg, memory_cap=cap)
    assert free.fallbacks == () and tight.fallbacks == ()  # every op of the step has a rule
    assert _param_bytes(model, tight.params, (4,)) <= cap
    assert tight.objective_us >= free.objective_us
    experts = [tight.params[w] for w in ("w1", "w2", "w3")]
    assert any(any(isinstance(p, Shard) for p in lay) for lay in experts), experts
    # the chosen parameter placements run under DTensor and compute what one device computes
    x = torch.randn(TOKENS, RUN.dim, generator=torch.Generator().manual_seed(5))
    ref = MoE(RUN)(x)
    with simulated_mesh((4,)) as sim:
        out = apply_choice(MoE(RUN), sim, tight.params, x, tight.input_layout)
        torch.testing.assert_close(out.full_tensor(), ref, rtol=1e-5, atol=1e-5)


def test_ilp_objective_is_the_brute_force_minimum_on_a_tiny_graph() -> None:
    class Scale(nn.Module):  # y = (x * w).relu(): a handful of nodes, every row enumerable
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(8, 4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(x * self.w)

    jg = trace_joint(Scale(), torch.randn(8, 4))
    with fake_world(2):
        mesh = init_device_mesh("cpu", (2,))
        ph = [n.name for n in jg.graph.graph.nodes if n.op == "placeholder"]
        strategies = query_graph(jg.graph, mesh, {ph[-2]: [(Shard(0),)], ph[-1]: [(Shard(0),)]})
        problem = build_problem(jg, strategies, Pricer(mesh), mesh)
        sol = solve(problem)
    names = list(problem.choices)
    sizes = [len(problem.choices[n].rows) for n in names]
    assert math.prod(sizes) < 200_000, sizes
    best = math.inf
    for pick in itertools.product(*[range(s) for s in sizes]):
        choice = dict(zip(names, pick))
        if any(choice[a] != choice[b] for a, b in problem.ties):
            continue
        cost = sum(problem.choices[n].compute_us[o] for n, o in choice.items())
        for e in problem.edges:  # what the consumer's row needs, from what the producer's row outputs
            u = e.producer_layout[choice[e.producer]]
            cost += math.inf if u is None else e.cost[choice[e.consumer]][u]
        best = min(best, cost)
    assert math.isfinite(best)
    assert sol.objective_us == pytest.approx(best, rel=1e-6, abs=1e-6)


def test_upstream_rules_are_asked_after_uninstall(joint) -> None:
    model, jg = joint
    with fake_world(4):
        mesh = init_device_mesh("cpu", (4,))
        ours = query_graph(jg.graph, mesh)
        dtensor_rules.uninstall()
        try:
            upstream = query_graph(jg.graph, mesh)
        finally:
            dtensor_rules.install()
    # scatter_add / gather: our rules add the index-sharded (Partial-output) rows upstream lacks
    ops = [n for n, r in ours.nodes.items() if str(r.target) in ("aten.scatter_add.default", "aten.gather.default")]
    assert ops
    assert all(len(ours.nodes[n].rows) > len(upstream.nodes[n].rows) for n in ops)


def test_solver_mode_rows_cost_at_most_ten_percent_more_variables_and_no_worse_objective(joint) -> None:
    """Solver-mode rows on the small block: ours (trimmed) vs upstream's rules vs ours in full."""
    from dtensor_rules.op_rules._solver_rows import full_enumeration

    model, jg = joint
    with fake_world(4):
        mesh = init_device_mesh("cpu", (4,))
        ours = choose_placements(model, None, mesh, joint=jg)
        with full_enumeration():
            full = choose_placements(model, None, mesh, joint=jg)
        dtensor_rules.uninstall()
        try:
            upstream = choose_placements(model, None, mesh, joint=jg)
        finally:
            dtensor_rules.install()
    assert ours.variables <= 1.1 * upstream.variables < full.variables
    assert ours.objective_us <= upstream.objective_us * (1 + 1e-9)
    assert ours.objective_us <= full.objective_us * (1 + 1e-6)  # a dominated row is never the cheaper one


@pytest.mark.slow  # starts a process (see pyproject.toml)
def test_benchmark_prints_the_table_and_runs_each_choice() -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root / "src")}
    run = subprocess.run([sys.executable, "benchmarks/solver_moe.py", "--quick", "--mesh", "4", "--cap", "0.5"],
                         cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [line for line in run.stdout.splitlines() if line.startswith("| (4,)")]
    assert [r.split("|")[2].strip() for r in rows] == ["ours", "ours+EP", "hand EP", "ours-full", "upstream", "op",
                                                       "op, no EP"]
    applied = [line for line in run.stdout.splitlines() if line.startswith("(4,) ")]
    assert len(applied) == 7 and all("applied: " in a and "not run" not in a for a in applied)
    # each choice, run on the simulated mesh, equals one device to fp32 rounding
    assert all(float(a.rsplit("applied: ", 1)[1].split()[0]) < 1e-5 for a in applied)


# Expert parallelism in the space (solver/ep_rows.py). Tokens and widths big enough that moves are
# priced by bandwidth rather than latency (the 32-token block above is latency-bound: TP wins there).
EP_TRACE = MoEConfig(dim=256, hidden=512, n_experts=8, top_k=2, gmm_dtype=torch.bfloat16)
EP_TOKENS = 4096


@pytest.fixture(scope="module")
def ep_joint():
    with torch.device("meta"):
        model = _MetaMoE(EP_TRACE)
    x = torch.empty(EP_TOKENS, EP_TRACE.dim, device="meta")
    return model, x, trace_joint(model, x)


class _MetaMoE(MoE):
    def init_weights(self, seed: int) -> None:  # meta parameters hold no values
        pass


def _chosen_out(choice, node: str):
    return choice.problem.choices[node].rows[choice.solution.choice[node]].outs[0]


def test_ep_rows_let_the_ilp_choose_expert_parallel_under_a_memory_cap(ep_joint) -> None:
    from dtensor_rules.solver.ep_rows import RoutedRows
    from dtensor_rules.solver import total_cost

    model, x, jg = ep_joint
    replicated = _param_bytes(model, {n: (Replicate(),) for n, _ in model.named_parameters()}, (4,))
    cap = 0.3 * replicated  # replicated experts (most of the bytes) cannot fit
    with fake_world(4):
        mesh = init_device_mesh("cpu", (4,))
        plain = choose_placements(model, x, mesh, joint=jg, memory_cap=cap)
        ep = choose_placements(model, x, mesh, joint=jg, memory_cap=cap, ep_rows=True)
    assert ep.fallbacks == ()
    assert _param_bytes(model, ep.params, (4,)) <= cap
    assert [ep.params[w] for w in ("w1", "w3", "w2")] == [(Shard(0),)] * 3  # experts split over ranks
    assert all(not isinstance(p, Shard) or p.dim != 0 for w in ("w1", "w3", "w2") for p in plain.params[w])
    grouped = [n for n in ep.problem.choices if n.startswith("_grouped_mm")]
    weight_grads = [n for n in grouped if type(_chosen_out(ep, n)[0]) is Shard]
    rows = [n for n in grouped if n not in weight_grads]
    assert len(weight_grads) == 3 and len(rows) == 4  # 3 forward + 1 grad-input grouped matmul run on token rows
    assert all(_chosen_out(ep, n) == (RoutedRows(0, 8, True),) for n in rows)  # aligned: each rank its experts' rows
    assert all(_chosen_out(ep, n) == (Shard(0),) for n in weight_grads)
    assert ep.objective_us < plain.objective_us  # a larger space, and EP is cheaper here
    assert total_cost(ep.problem, ep.solution.choice) == pytest.approx(ep.objective_us, rel=1e-6)


def test_hand_ep_is_priced_with_its_dispatch_and_the_free_choice_is_no_dearer(ep_joint) -> None:
    from dtensor_rules.solver.ep_rows import RoutedRows

    model, x, jg = ep_joint
    hand = {"w1": (Shard(0),), "w3": (Shard(0),), "w2": (Shard(0),), "gate": (Replicate(),)}
    with fake_world(4):
        mesh = init_device_mesh("cpu", (4,))
        fixed = choose_placements(model, x, mesh, joint=jg, hand_ep=hand)
        free = choose_placements(model, x, mesh, joint=jg, ep_rows=True)
    assert all(fixed.params[k] == v for k, v in hand.items())
    p, s = fixed.problem, fixed.solution
    ru, ra = RoutedRows(0, 8, False), RoutedRows(0, 8, True)
    moves = {(e.layouts[e.producer_layout[s.choice[e.producer]]], p.choices[e.consumer].rows[s.choice[e.consumer]].ins[e.arg])
             for e in p.edges}
    assert ((ru,), (ra,)) in moves and ((ra,), (ru,)) in moves  # dispatch and combine, both priced
    assert free.objective_us <= fixed.objective_us * (1 + 1e-9)


def _one_device(config: MoEConfig, xs: torch.Tensor, cot: torch.Tensor) -> tuple[list[str], list[torch.Tensor]]:
    """Names and values of the output and of every parameter's gradient of ``(MoE(config)(xs) * cot).sum()``."""
    one = MoE(config)
    ref = one(xs)
    return ["output", *(n for n, _ in one.named_parameters())], [ref, *torch.autograd.grad(ref, list(one.parameters()), cot)]


def _applied(config: MoEConfig, shape: tuple[int, ...], params: dict, input_layout: tuple, xs: torch.Tensor,
             cot: torch.Tensor) -> tuple[list[torch.Tensor], dict, dict]:
    """The choice applied through ``expert_parallel`` on a simulated mesh: (full output and parameter
    gradients, gradient placements by name, collective bytes by kind)."""
    from dtensor_rules.testing.comm import CommBytesMode

    with simulated_mesh(shape) as sim:
        module = MoE(config)
        with CommBytesMode() as comm:
            out = apply_choice(module, sim, params, xs, input_layout, ep=True)
            loss = (out * distribute_tensor(per_rank_copies(cot), sim, (Replicate(),) * len(shape))).sum()
            grads = torch.autograd.grad(loss, list(module.parameters()))
        names = [n for n, _ in module.named_parameters()]
        placements = {n: tuple(g.placements) for n, g in zip(names, grads)}
        bytes_by_kind = {k: comm.total_bytes(k) for k in ("all_to_all", "all_gather")}
        return [out.full_tensor(), *(g.full_tensor() for g in grads)], placements, bytes_by_kind


def test_the_expert_parallel_choice_runs_through_expert_parallel_and_equals_one_device(ep_joint) -> None:
    """The ILP's EP choice (1-D mesh), applied through ``expert_parallel``: output and every gradient
    equal one device (fp32), the expert gradients stay ``Shard(0)`` (the plain path gives them
    Replicate), and the tokens travel by all-to-all."""
    model, x, jg = ep_joint
    replicated = _param_bytes(model, {n: (Replicate(),) for n, _ in model.named_parameters()}, (4,))
    with fake_world(4):
        ep = choose_placements(model, x, init_device_mesh("cpu", (4,)), joint=jg, memory_cap=0.3 * replicated,
                               ep_rows=True)
    config = MoEConfig(dim=16, hidden=32, n_experts=EP_TRACE.n_experts, top_k=2)  # same experts, small widths
    xs = torch.randn(TOKENS, config.dim, generator=torch.Generator().manual_seed(7))
    cot = torch.randn(TOKENS, config.dim, generator=torch.Generator().manual_seed(8))
    names, want = _one_device(config, xs, cot)
    got, placements, moved = _applied(config, (4,), ep.params, ep.input_layout, xs, cot)
    assert all(placements[w] == (Shard(0),) for w in ("w1", "w3", "w2")), placements
    assert moved["all_to_all"] > 0, moved
    for name, g, w in zip(names, got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5, msg=name)


def test_an_ep_row_prices_each_rank_on_its_own_share_of_the_index() -> None:
    """The permute ``x[token]`` in an expert-parallel row (x ``Shard(0)``, ids ``Replicate`` ->
    ``TokenRows(0)``): in the EP region each rank gathers only its own tokens' rows, so it costs
    what the same gather on a quarter of the ids does (ids ``Shard(0)``), not the whole-index
    gather (4x the rows)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from dtensor_rules._upstream import TensorMeta
    from dtensor_rules.solver.ep_rows import RoutedRows
    from dtensor_rules.solver.query import Row

    x = torch.empty(16384, 2048, device="meta")  # solver_moe.py's layer: 16384 tokens, top 6
    ids = torch.empty(6 * 16384, dtype=torch.int64, device="meta")
    gm = make_fx(lambda x, ids: x[ids])(x, ids)
    node = next(n for n in gm.graph.nodes if n.op == "call_function")
    metas = tuple(TensorMeta(t.shape, t.stride(), t.dtype) for t in (x, ids))
    S, R = Shard(0), Replicate()
    with fake_world(4):
        pricer = Pricer(init_device_mesh("cpu", (4,)))
        routed = pricer.compute_us(node, Row(((RoutedRows(0, 8, False),),), ((S,), (R,))), metas)
        own = pricer.compute_us(node, Row(((S,),), ((S,), (S,))), metas)
        whole = pricer.compute_us(node, Row(((R,),), ((S,), (R,))), metas)
    assert routed == own and whole > 3.5 * own


# the expert-parallel layouts the solver chose on the DeepSeek-V2-Lite-like layer (docs/solver.md):
# ep on mesh dim 1 with expert TP on dim 0; and expert_parallel's hand layout (ep on dim 0)
_R = Replicate()
EP_ON_DIM_1 = {"gate": (_R, _R), "w1": (Shard(2), Shard(0)), "w3": (Shard(2), Shard(0)), "w2": (Shard(1), Shard(0)),
               "shared_w1": (_R, Shard(0)), "shared_w3": (Shard(1), _R), "shared_w2": (_R, _R)}
HAND_EP = {"gate": (_R, _R), "w1": (Shard(0), Shard(2)), "w3": (Shard(0), Shard(2)), "w2": (Shard(0), Shard(1)),
           "shared_w1": (_R, Shard(0)), "shared_w3": (_R, Shard(0)), "shared_w2": (_R, Shard(1))}
# experts stored split on mesh dim 0 along D (not the hidden, TP, split): expert FSDP, gathered inside the
# region; ep on dim 1
EP_FSDP_ON_DIM_0 = dict(EP_ON_DIM_1, w1=(Shard(1), Shard(0)), w3=(Shard(1), Shard(0)), w2=(Shard(2), Shard(0)))
DATA_PARALLEL = (Shard(0), Shard(0))  # the solver's default input layout


@pytest.mark.parametrize("shape, params, tp_dim", [
    ((2, 4), EP_ON_DIM_1, 0),
    ((2, 4), EP_FSDP_ON_DIM_0, None),
    pytest.param((4, 8), EP_ON_DIM_1, 0, marks=pytest.mark.slow),  # 32 simulated ranks: ~4 s each
    pytest.param((4, 8), HAND_EP, 1, marks=pytest.mark.slow),
], ids=["2x4 ep on dim 1", "2x4 ep on dim 1, experts fsdp on dim 0", "4x8 (32 ranks) ep on dim 1", "4x8 hand EP"])
def test_expert_parallel_choices_on_any_mesh_dim_run_through_expert_parallel(shape, params, tp_dim) -> None:
    """An EP layout whose ep is mesh dim 1 (or 0), with expert TP or expert FSDP on the other dim, runs
    through ``expert_parallel`` on up to 32 simulated ranks from the solver's data-parallel input:
    output and every gradient equal one device, every expert gradient comes back in the chosen
    layout, and the tokens travel by all-to-all."""
    from dtensor_rules.solver.apply import expert_parallel_dim, expert_tp_dim

    ep_dim = expert_parallel_dim(params)
    assert ep_dim == (1 if params is not HAND_EP else 0)
    assert expert_tp_dim(params, ep_dim) == tp_dim
    config = MoEConfig(dim=16, hidden=32, n_experts=8, top_k=2, n_shared=1)
    xs = torch.randn(12, config.dim, generator=torch.Generator().manual_seed(3))
    cot = torch.randn(12, config.dim, generator=torch.Generator().manual_seed(4))
    names, want = _one_device(config, xs, cot)
    got, placements, moved = _applied(config, shape, params, DATA_PARALLEL, xs, cot)
    assert moved["all_to_all"] > 0, moved
    for w in ("w1", "w3", "w2"):
        assert placements[w] == params[w], (w, placements[w])
    for name, g, w in zip(names, got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5, msg=name)


def test_a_choice_without_one_expert_parallel_dim_is_refused_with_ep() -> None:
    mixed = dict(EP_ON_DIM_1, w2=(Shard(0), Shard(1)))  # w2 split by expert on the other mesh dim
    with simulated_mesh((2, 4)) as sim, pytest.raises(ValueError, match="Shard\\(0\\) on one mesh dim"):
        apply_choice(MoE(MoEConfig(dim=16, hidden=32, n_experts=8, top_k=2)), sim, mixed,
                     torch.randn(4, 16), (Replicate(),) * 2, ep=True)


# expert parallelism offered by the routed-experts op's own rule: plain strategy enumeration, no graph pass

LITE_OP = MoEConfig(dim=2048, hidden=1408, n_experts=64, top_k=6, n_shared=2, gmm_dtype=torch.bfloat16)


class _MetaMoE(MoE):
    def init_weights(self, seed: int) -> None:  # meta parameters hold no values to draw
        pass


def _op_joint(tokens: int):
    """The DeepSeek-V2-Lite-sized block (meta: sizes only) with its routed experts as one op."""
    from dtensor_rules.ep.routed_op import routed_experts_as_op

    with torch.device("meta"):
        model = _MetaMoE(LITE_OP)
    model.routed_region = routed_experts_as_op
    x = torch.empty(tokens, LITE_OP.dim, device="meta")
    return model, x, trace_joint(model, x)


@pytest.mark.parametrize("shape, tokens, names", [
    ((4,), 16384, ("a",)),
    pytest.param((2, 2), 4096, ("a", "b"), marks=pytest.mark.slow),  # the 2-D ILP takes ~15 s here
], ids=["4", "2x2"])
def test_the_routed_experts_rule_lets_plain_enumeration_choose_expert_parallel_and_it_runs(shape, tokens, names) -> None:
    """Offered EP only by the op's rule, the ILP puts the experts Shard(0) on every mesh dim with the
    tokens Shard(0) everywhere (torchtitan's model), cheaper than without that row; the choice, run
    through expert_parallel on a small fp32 block, equals one device (output and gradients)."""
    from dtensor_rules.ep.routed_experts_rule import expert_parallel_rows
    from dtensor_rules.solver.ep_row import expert_row, place_expert_row

    model, x, jg = _op_joint(tokens)
    with fake_world(math.prod(shape)):
        mesh = init_device_mesh("cpu", shape)
        chosen = choose_placements(model, x, mesh, joint=jg)
        with expert_parallel_rows(False):
            no_ep = choose_placements(model, x, mesh, joint=jg)
    assert chosen.fallbacks == ()
    row = expert_row(chosen)
    everywhere = (Shard(0),) * len(shape)
    assert row is not None and row.ep_dims == tuple(range(len(shape))) and row.tokens == everywhere, row
    assert not expert_row(no_ep).ep_dims
    assert chosen.objective_us < no_ep.objective_us
    cfg = MoEConfig(dim=16, hidden=32, n_experts=8, top_k=2)
    x_run = torch.randn(32, 16, generator=torch.Generator().manual_seed(7))
    g = torch.randn(32, 16, generator=torch.Generator().manual_seed(8))
    ref_model = MoE(cfg)
    ref_out = ref_model(x_run)
    ref_grads = torch.autograd.grad(ref_out, [ref_model.w1, ref_model.w2, ref_model.gate], g)
    with simulated_mesh(shape, names=names) as sim:
        module = place_expert_row(MoE(cfg), sim, chosen)
        assert module.routed_region is not None  # expert_parallel's region, not the op
        out = module(distribute_tensor(per_rank_copies(x_run), sim, chosen.input_layout))
        grads = torch.autograd.grad(out, [module.w1, module.w2, module.gate],
                                    distribute_tensor(per_rank_copies(g), sim, chosen.input_layout))
        assert grads[0].placements == everywhere  # each rank holds only its experts' gradient
        got = [t.full_tensor() for t in (out, *grads)]
    for a, b in zip(got, (ref_out, *ref_grads)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("experts, tokens", [
    (((Shard(0), Shard(2)), (Shard(0), Shard(2)), (Shard(0), Shard(1))), (Shard(0), Replicate())),
    (((Replicate(), Shard(0)), (Replicate(), Shard(0)), (Replicate(), Shard(0))), (Replicate(), Shard(0))),
], ids=["ep0-tp1", "ep1-replicated0"])
def test_a_one_dim_expert_parallel_row_runs_through_expert_parallel_with_its_tp_dim(experts, tokens) -> None:
    """A routed-experts row with the experts Shard(0) on ONE mesh dim and the tokens replicated on the
    other runs as expert_parallel(ep_dim, tp_dim) with the stored layouts; equal to one device."""
    from dtensor_rules.solver.choose import Choice
    from dtensor_rules.solver.ep_row import expert_row, place_expert_row
    from dtensor_rules.solver.ilp import Solution
    from dtensor_rules.solver.problem import Choice as NodeChoice, Problem
    from dtensor_rules.solver.query import Row

    R2 = (Replicate(), Replicate())
    row = Row((tokens,), (tokens, tokens, tokens, *experts))
    problem = Problem({"routed": NodeChoice("routed", [row], [0.0])}, [], [], {}, {})
    params = {"w1": experts[0], "w3": experts[1], "w2": experts[2], "gate": R2, "shared_w1": R2,
              "shared_w3": R2, "shared_w2": R2}
    choice = Choice(params, (Shard(0), Shard(0)), 0.0, 0, 0, 0.0, 0.0, (), problem,
                    Solution({"routed": 0}, 0.0, 0, 0, 0.0, "Optimal"), "routed")
    ep = 0 if experts[0][0] == Shard(0) else 1
    assert expert_row(choice).ep_dims == (ep,)
    cfg = MoEConfig(dim=16, hidden=32, n_experts=4, top_k=2)
    x = torch.randn(32, 16, generator=torch.Generator().manual_seed(9))
    ref_model = MoE(cfg)
    ref_out = ref_model(x)
    ref_grad = torch.autograd.grad(ref_out.sum(), ref_model.w2)[0]
    with simulated_mesh((2, 2)) as sim:
        module = place_expert_row(MoE(cfg), sim, choice)
        assert module.w1.placements == experts[0]  # stored as chosen
        out = module(distribute_tensor(per_rank_copies(x), sim, choice.input_layout))
        grad = torch.autograd.grad(out.full_tensor().sum(), module.w2)[0]
        torch.testing.assert_close(out.full_tensor(), ref_out, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(grad.full_tensor(), ref_grad, rtol=1e-5, atol=1e-5)

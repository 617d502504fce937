"""A solver is offered no row that only relabels a replicated value as a partial one.

AutoParallel prices ``Replicate -> Partial`` as impossible and a switch of Partial kind
(``avg -> sum``) as free, then performs that switch as a full all-reduce. Rows such as
``index_put(P(avg) self, R idx, R values) -> P(avg)`` let its ILP route a partial sum through a
replicated operand disguised as a mean (docs/solver.md, "AutoParallel's free partial switch").
Here: no such row reaches a solver's query (whatever rule offers it), dispatch still runs them,
a kind switch is priced as the all-reduce that performs it, and an ILP over the MoE block's
training step chooses no relabel and its plan, run node by node on a simulated mesh, equals one
device.

What counts as a relabel (the oracle below, written from the definition, not from the code under
test), on one mesh dim: a Partial output with every input Replicate; or a Partial(op) output
(op avg / max / min: the partial of a replicated value is the value) with a Replicate input whose
lift to Partial(op) the rule also offers (the row is that one after a free relabel of the input).
Rows with a Partial(sum) output next to a Replicate input whose lift is valid too are legitimate:
in every rule that has them (cat's zero-element part, slice_scatter's operand an empty or full
slice ignores) that input contributes nothing to the output, so nothing is relabelled.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.utils import _pytree as pytree

from dtensor_rules._upstream import LocalTensor, per_rank_copies
from dtensor_rules.models.moe import MoE, MoEConfig
from dtensor_rules.registry import rules
from dtensor_rules.solver import choose_placements, trace_joint
from dtensor_rules.solver.price import Pricer
from dtensor_rules.testing import fake_world, simulated_mesh
from dtensor_rules.testing.dispatch import full_value, to_dtensor
from dtensor_rules.testing.query import active_strategy, emitted_combos, tensor_meta
from dtensor_rules.testing.simulate import Sample, coords

aten = torch.ops.aten
R = Replicate()
AVG = Partial("avg")
KEEPS_A_REPLICATED_VALUE = ("avg", "max", "min")


def relabels(combos: Iterable[tuple], valid: set[tuple]) -> list[tuple]:
    """``(ins, outs)`` combos (one layout per tensor, one placement per mesh dim) that relabel a
    replicated value as a partial one on some mesh dim; ``valid``: every combo the rule offers."""
    found = []
    for ins, outs in combos:
        for m in range(len(ins[0]) if ins else 0):
            out_m = [o[m] for o in outs if o is not None]
            partial = {p.reduce_op for p in out_m if isinstance(p, Partial)}
            if not partial:
                continue
            if all(i[m] == R for i in ins):
                found.append((ins, outs, m, "every input Replicate"))
                continue
            if len(partial) != 1 or (op := next(iter(partial))) not in KEEPS_A_REPLICATED_VALUE:
                continue
            replicated = [k for k, i in enumerate(ins) if i[m] == R]
            for lift in [(k,) for k in replicated] + ([tuple(replicated)] if len(replicated) > 1 else []):
                lifted = tuple(tuple(Partial(op) if (k in lift and d == m) else p for d, p in enumerate(i))
                               for k, i in enumerate(ins))
                if (lifted, outs) in valid:
                    found.append((ins, outs, m, f"inputs {lift} relabelled as Partial({op})"))
                    break
    return found


@pytest.fixture(scope="module")
def mesh1():
    with fake_world(2):
        yield init_device_mesh("cpu", (2,))


def _combos(op, sample: Sample, mesh, full: bool) -> set[tuple]:
    kind, fn = active_strategy(op)
    return emitted_combos(kind, fn, op, sample, mesh, full=full)


def _index_put_sample(accumulate: bool) -> Sample:
    g = torch.Generator().manual_seed(0)
    return Sample((torch.randn(8, 4, generator=g), [torch.tensor([0, 2, 5])], torch.randn(3, 4, generator=g), accumulate), {})


@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put_offers_a_solver_its_partial_row_and_no_relabel(mesh1, accumulate: bool) -> None:
    sample = _index_put_sample(accumulate)
    full = _combos(aten.index_put.default, sample, mesh1, full=True)
    solver = _combos(aten.index_put.default, sample, mesh1, full=False)
    relabelling = (((AVG,), (R,), (R,)), ((AVG,),))  # P(avg) self, R values: the values relabelled
    from_replicated_self = (((R,), (R,), (AVG,)), ((AVG,),))
    partial = (((AVG,), (R,), (AVG,)), ((AVG,),))
    assert {relabelling, from_replicated_self, partial} <= full  # the rule keeps them (dispatch, validator)
    assert partial in solver
    assert relabelling not in solver and from_replicated_self not in solver
    assert relabels(solver, full) == []


def test_index_offers_a_solver_no_relabel(mesh1) -> None:
    g = torch.Generator().manual_seed(1)
    sample = Sample((torch.randn(6, 5, generator=g), [None, torch.tensor([[0, 4], [1, 1]])]), {})
    full = _combos(aten.index.Tensor, sample, mesh1, full=True)
    solver = _combos(aten.index.Tensor, sample, mesh1, full=False)
    assert (((AVG,), (R,)), ((AVG,),)) in solver  # a Partial passes through a selection
    assert relabels(solver, full) == []


def _samples(rule, n: int) -> list[Sample]:
    return [Sample(tuple(args), dict(kwargs)) for args, kwargs in list(rule.samples())[:n]]


def test_no_registered_rule_offers_a_solver_a_relabel(mesh1) -> None:
    """Every rule of the package with a sample suite, asked as a solver asks (every candidate layout
    per input) on its first samples: no relabel among the rows; the rule itself may keep them."""
    checked, found = 0, {}
    for op, rule in sorted(rules().items(), key=lambda kv: str(kv[0])):
        if rule.samples is None or active_strategy(op) is None:
            continue
        for sample in _samples(rule, 3):
            try:
                full = _combos(op, sample, mesh1, full=True)
                solver = _combos(op, sample, mesh1, full=False)
            except (RuntimeError, NotImplementedError, ValueError, IndexError):
                continue  # a sample only a layout outside this mesh can run (the rule's own tests cover it)
            checked += 1
            bad = relabels(solver, full)
            if bad:
                found[str(op)] = bad[:2]
    assert checked > 50, checked
    assert found == {}, found


def test_dispatch_still_runs_index_put_on_a_partial_self_with_replicated_values() -> None:
    """The relabelling row is correct and useful at dispatch (an eager call holds one layout): a
    ``Partial(avg)`` self and replicated values give a ``Partial(avg)`` result, no all-reduce."""
    g = torch.Generator().manual_seed(2)
    x, values, idx = torch.randn(8, 4, generator=g), torch.randn(3, 4, generator=g), torch.tensor([0, 2, 5])
    with simulated_mesh((2,)) as mesh:
        out = aten.index_put.default(to_dtensor(x, mesh, (AVG,)), [to_dtensor(idx, mesh, (R,))],
                                     to_dtensor(values, mesh, (R,)), False)
        assert tuple(out.placements) == (AVG,)
        torch.testing.assert_close(full_value(out), aten.index_put.default(x, [idx], values, False))


def test_a_partial_switch_is_priced_as_the_all_reduce_that_performs_it() -> None:
    meta = tensor_meta(torch.empty(4096, 512, device="meta"))
    with fake_world(8):
        mesh = init_device_mesh("cpu", (4, 2))
        pricer = Pricer(mesh)
        all_reduce = pricer.edge_us(meta, (AVG, R), (R, R))
        assert all_reduce > 0
        assert pricer.edge_us(meta, (AVG, R), (Partial("sum"), R)) == pytest.approx(all_reduce)
        assert pricer.edge_us(meta, (Partial("sum"), R), (AVG, R)) == pytest.approx(all_reduce)
        # with another mesh dim moving too: what moving to Replicate on the switched dim costs
        # (the planner splits locally first, so less is all-reduced), then a free partition
        via = pricer.edge_us(meta, (AVG, R), (R, Shard(0)))
        assert 0 < via < all_reduce
        assert pricer.edge_us(meta, (AVG, R), (Partial("sum"), Shard(0))) == pytest.approx(via)
        assert pricer.edge_us(meta, (R, R), (AVG, R)) == 0.0  # a relabel is free


# the block small enough to run every node of its training step on simulated ranks; bf16 experts:
# the CPU meta kernel of _grouped_mm (what fake tracing runs) is bf16-only
CONFIG = MoEConfig(dim=16, hidden=32, n_experts=4, top_k=2, gmm_dtype=torch.bfloat16)
TOKENS = 32


def _move(x: DTensor, layout: Sequence) -> DTensor:
    """``x`` laid out as ``layout``. A switch of Partial kind goes through Replicate (the all-reduce
    the solver prices it as; DTensor moves no Partial kind into another); a new Partial is made from
    Replicate by hand, as the partition does (``redistribute`` keeps that for internal use): the
    value stays on mesh coordinate 0 of a ``Partial(sum)`` dim, every rank keeps it for avg/max/min."""
    layout = tuple(layout)
    if tuple(x.placements) == layout:
        return x
    new_partial = [m for m, (p, q) in enumerate(zip(x.placements, layout)) if isinstance(q, Partial) and p != q]
    via = tuple(R if m in new_partial else q for m, q in enumerate(layout))
    if tuple(x.placements) != via:
        x = x.redistribute(x.device_mesh, via)
    if not new_partial:
        return x
    mesh = x.device_mesh
    local = x.to_local()
    sums = [m for m in new_partial if layout[m].reduce_op == "sum"]
    if sums:
        parts = local._local_tensors
        local = LocalTensor({r: t if all(c[m] == 0 for m in sums) else torch.zeros_like(t)
                             for (r, t), c in zip(sorted(parts.items()), coords(tuple(mesh.shape)))})
    return DTensor.from_local(local, mesh, layout, run_check=False, shape=x.shape, stride=x.stride())


def run_plan(choice, jg, mesh, inputs: Sequence[torch.Tensor]) -> list:
    """Run the traced step node by node with every tensor argument moved to the layout the chosen
    row reads and every result moved to the layout the row outputs; the graph's outputs."""
    problem, picked = choice.problem, choice.solution.choice
    env: dict[str, object] = {}
    placeholders = iter(inputs)
    for node in jg.graph.graph.nodes:
        if node.op == "placeholder":
            row = problem.choices[node.name].rows[picked[node.name]]
            env[node.name] = distribute_tensor(per_rank_copies(next(placeholders)), mesh, row.outs[0])
        elif node.op == "call_function" and node.target is operator.getitem:
            env[node.name] = env[node.args[0].name][node.args[1]]
        elif node.op == "call_function":
            row = problem.choices[node.name].rows[picked[node.name]]
            moved = iter(_move(env[a.name], lay) for a, lay in zip(
                [a for a in pytree.tree_leaves((node.args, node.kwargs)) if isinstance(a, torch.fx.Node)], row.ins))
            args, kwargs = pytree.tree_map(lambda a: next(moved) if isinstance(a, torch.fx.Node) else a, (node.args, node.kwargs))
            out = node.target(*args, **kwargs)
            if isinstance(out, DTensor):
                out = _move(out, row.outs[0])
            elif isinstance(out, (tuple, list)):
                out = type(out)(_move(o, lay) if isinstance(o, DTensor) and lay is not None else o
                                for o, lay in zip(out, row.outs))
            env[node.name] = out
        elif node.op == "output":
            return [env[a.name] if isinstance(a, torch.fx.Node) else a for a in node.args[0]]
    raise AssertionError("the graph has no output node")


@pytest.mark.slow  # the ILP over ~170 nodes, then every node on 4 simulated ranks
def test_an_ilp_over_the_moe_step_chooses_no_relabel_and_its_plan_equals_one_device() -> None:
    model = MoE(CONFIG)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(TOKENS, CONFIG.dim, generator=g)
    jg = trace_joint(model, x)
    params = [p.detach() for p in model.parameters()]
    buffers = [b.detach() for b in model.buffers()]
    with fake_world(4):
        mesh = init_device_mesh("cpu", (2, 2))
        replicated = sum(p.numel() * p.itemsize for p in params)
        choice = choose_placements(model, x, mesh, joint=jg, memory_cap=replicated * 0.6)
    ops = {n.name for n in jg.graph.graph.nodes if n.op == "call_function"}
    chosen = []
    for name in ops & set(choice.problem.choices):
        rows = choice.problem.choices[name].rows
        offered = {(r.ins, r.outs) for r in rows}
        assert relabels(offered, offered) == [], name
        row = rows[choice.solution.choice[name]]
        chosen.append((row.ins, row.outs))
    assert any(isinstance(p, Partial) for ins, outs in chosen for o in outs if o for p in o)  # partials do flow
    tangent = torch.randn(TOKENS, CONFIG.dim, generator=g)
    expected = jg.graph(*params, *buffers, x, tangent)
    with simulated_mesh((2, 2)) as sim:
        got = run_plan(choice, jg, sim, [*params, *buffers, x, tangent])
        got = [full_value(v) for v in got]
    assert len(got) == len(expected) == 1 + len(params)
    for name, a, b in zip(("out", *jg.params), got, expected):
        torch.testing.assert_close(a, b, atol=5e-2, rtol=5e-2, msg=lambda m, name=name: f"{name}: {m}")

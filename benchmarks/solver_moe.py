"""An ILP placement solver over the MoE block's training step: our rules vs upstream's.

What AutoParallel does, with this package's pieces and independently of it
(``dtensor_rules.solver``): trace the block's joint forward+backward on fake tensors, ask every
node's strategies in solver mode (every candidate layout of each input) from the rules
installed in DTensor, price compute with our flop/byte formulas (h100 profile) and every
producer->consumer move with the ordered-mesh planner, and choose one row per node with PuLP/CBC
under a per-rank parameter-memory cap. The same trace is solved with our rules installed and
with upstream's (``dtensor_rules.uninstall()``), priced by the same functions, so the objectives
compare; "ours-full" is our rules with the solver-mode trim off (the full enumeration switch,
``dtensor_rules.op_rules._solver_rows``), what solvers got before issue 19 item 6. Printed per mesh: ILP variables and constraints, CBC solve time, query+pricing time,
objective (us per step, modelled), and the chosen expert placement; then every parameter's
layout, run on the small block in fp32 on a simulated mesh of that shape (at most 8 ranks) and
compared with one device. "ours+EP" adds the expert-parallel rows (``solver/ep_rows.py``: routed-rows
labels between permute and combine, experts ``Shard(0)``; routed sizes priced as an even split,
i.e. expected-uniform routing), so the ILP may choose expert parallelism; "hand EP" prices
``expert_parallel``'s fixed layout with the same model (parameters fixed, the permute/dispatch/grouped-matmul/
combine nodes held to their EP rows, the rest placed by the ILP; no memory cap). "applied" runs the parameter
layouts (``apply_choice``); an EP choice (experts ``Shard(0)`` on one mesh dim) runs through ``expert_parallel``
(``apply_choice(..., ep=True)``: tokens by all-to-all, no all-gather of experts), the others through plain DTensor
dispatch. "op" traces the block with its routed experts as ONE op (``ep/routed_op.py``) whose DTensor rule
offers expert parallelism as a row (``ep/routed_experts_rule.py``), solved by plain strategy enumeration (no graph
pass; the EP row's all-to-alls and host sync priced by ``Pricer.ep_exchange_us``); "op, no EP" withholds that row;
their "applied" runs the chosen routed-experts row (``solver.ep_row.place_expert_row``: an EP row through
``expert_parallel``) on the small block with 64 experts (every ep size of these meshes divides them).

    python benchmarks/solver_moe.py                  # DeepSeek-V2-Lite-like layer, meshes (8,), (2,4), (4,8)
    python benchmarks/solver_moe.py --quick          # the small test config, meshes (8,) and (2,4)
    python benchmarks/solver_moe.py --cap 0.25       # memory cap: a fraction of the replicated parameter bytes
    python benchmarks/solver_moe.py --mesh 2x4 --mesh 4x8 --rules op --rules "op, no EP"   # docs/solver.md's EP table
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from typing import NamedTuple

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import distribute_tensor


import dtensor_rules
from dtensor_rules._upstream import per_rank_copies
from dtensor_rules.op_rules._solver_rows import full_enumeration
from dtensor_rules.models.moe import MoE, MoEConfig
from dtensor_rules.ep.routed_op import routed_experts_as_op
from dtensor_rules.ep.routed_experts_rule import expert_parallel_rows
from dtensor_rules.solver import apply_choice, choose_placements, trace_joint
from dtensor_rules.solver.apply import expert_parallel_dim
from dtensor_rules.solver.ep_row import expert_row, place_expert_row
from dtensor_rules.testing import fake_world, simulated_mesh
from dtensor_rules.testing.mesh import MAX_SIMULATED

# DeepSeek-V2-Lite: dim 2048, moe_intermediate_size 1408, 64 routed experts, top 6, 2 shared experts
LITE = MoEConfig(dim=2048, hidden=1408, n_experts=64, top_k=6, n_shared=2, gmm_dtype=torch.bfloat16)
LITE_TOKENS = 16384
SMALL = MoEConfig(dim=16, hidden=32, n_experts=8, top_k=2, gmm_dtype=torch.bfloat16)
SMALL_TOKENS = 64
MESHES = ((8,), (2, 4), (4, 8))
# ours: solver-mode rows as shipped; ours+EP: plus the expert-parallel (routed-rows) rows of solver/ep_rows.py;
# hand EP: expert_parallel's fixed layout (experts Shard(0) on mesh dim 0, TP on dim 1) priced by the same model;
# ours-full: every row (op_rules._solver_rows.full_enumeration); upstream: torch's rules
# op / op, no EP: the block with its routed experts as ONE op (ep/routed_op.py), traced and solved by plain
# strategy enumeration (no graph pass): the op's rule offers expert parallelism as a row (ep/routed_experts_rule.py);
# "op, no EP" withholds that row (what EP itself adds on the same graph)
RULES = ("ours", "ours+EP", "hand EP", "ours-full", "upstream", "op", "op, no EP")
OP_RULES = ("op", "op, no EP")


def hand_ep_layout(ndim: int) -> dict:
    """``expert_parallel`` / ``shard_moe``'s layout: experts ``Shard(0)`` on ep (mesh dim 0), TP on dim 1."""
    from torch.distributed.tensor import Replicate, Shard

    R = Replicate()
    if ndim == 1:
        return {"w1": (Shard(0),), "w3": (Shard(0),), "w2": (Shard(0),), "gate": (R,),
                "shared_w1": (R,), "shared_w3": (R,), "shared_w2": (R,)}
    rest = (R,) * (ndim - 2)
    return {"w1": (Shard(0), Shard(2), *rest), "w3": (Shard(0), Shard(2), *rest), "w2": (Shard(0), Shard(1), *rest),
            "gate": (R, R, *rest), "shared_w1": (R, Shard(0), *rest), "shared_w3": (R, Shard(0), *rest),
            "shared_w2": (R, Shard(1), *rest)}


class Row(NamedTuple):
    mesh: str
    rules: str
    variables: int
    constraints: int
    solve_s: float
    query_s: float
    objective_us: float
    experts: str
    params: dict
    applied: str  # max |out - one device| of the small fp32 block run with these layouts, or why not


def _pl(layout: tuple) -> str:
    return "(" + ", ".join("R" if p.is_replicate() else f"S({p.dim})" if p.is_shard() else str(p) for p in layout) + ")"


def run(config: MoEConfig, tokens: int, meshes: tuple, cap_fraction: float | None,
        rule_sets: tuple[str, ...] = RULES) -> list[Row]:
    model = _meta_module(config)
    op_model = _meta_module(config)
    op_model.routed_region = routed_experts_as_op
    x = torch.empty(tokens, config.dim, device="meta")
    t0 = time.perf_counter()
    jg = trace_joint(model, x)
    jg_op = trace_joint(op_model, x) if set(rule_sets) & set(OP_RULES) else None
    print(f"solver_moe: traced the joint step ({len(jg.graph.graph.nodes)} nodes"
          + (f"; {len(jg_op.graph.graph.nodes)} with the routed-experts op" if jg_op else "")
          + f") in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    replicated = sum(p.numel() * p.dtype.itemsize for p in model.parameters())
    cap = None if cap_fraction is None else replicated * cap_fraction
    rows = []
    for shape in meshes:
        with fake_world(math.prod(shape)):
            mesh = init_device_mesh("cpu", shape)
            for rules in rule_sets:
                if rules in OP_RULES:
                    with expert_parallel_rows(rules == "op"):
                        c = choose_placements(op_model, x, mesh, memory_cap=cap, joint=jg_op)
                    row = expert_row(c)
                    experts = "/".join(_pl(w) for w in row.experts)
                    rows.append(Row(str(shape), rules, c.variables, c.constraints, c.solve_s, c.query_s, c.objective_us,
                                    experts, {"op row tokens": _pl(row.tokens), **{k: _pl(v) for k, v in c.params.items()}},
                                    _apply_row(shape, c)))
                    print(f"solver_moe: mesh {shape} {rules}: {c.variables} variables, solved in {c.solve_s:.1f} s"
                          + (f", {len(c.fallbacks)} node(s) without a rule" if c.fallbacks else ""), file=sys.stderr)
                    continue
                (dtensor_rules.uninstall if rules == "upstream" else dtensor_rules.install)()
                try:
                    with full_enumeration(rules == "ours-full"):
                        c = choose_placements(model, x, mesh, memory_cap=None if rules == "hand EP" else cap, joint=jg,
                                              ep_rows=rules == "ours+EP",
                                              hand_ep=hand_ep_layout(len(shape)) if rules == "hand EP" else None)
                finally:
                    dtensor_rules.install()
                experts = "/".join(_pl(c.params[w]) for w in ("w1", "w3", "w2"))
                rows.append(Row(str(shape), rules, c.variables, c.constraints, c.solve_s, c.query_s, c.objective_us,
                                experts, {k: _pl(v) for k, v in c.params.items()},
                                _apply(shape, c.params, c.input_layout, ep=rules in ("ours+EP", "hand EP")
                                       and expert_parallel_dim(c.params) is not None)))
                print(f"solver_moe: mesh {shape} {rules}: {c.variables} variables, solved in {c.solve_s:.1f} s"
                      + (f", {len(c.fallbacks)} node(s) without a rule" if c.fallbacks else ""), file=sys.stderr)
    return rows


def _apply(shape: tuple, params: dict, input_layout: tuple, ep: bool = False) -> str:
    """Run the small block in fp32 with these parameter layouts on a simulated mesh of ``shape``
    (every rank in this process, real data) and compare with one device; ``ep``: an
    expert-parallel choice, run through ``expert_parallel`` (all-to-all, no all-gather of experts)."""
    if math.prod(shape) > MAX_SIMULATED:
        return f"not run (simulating {math.prod(shape)} ranks; at most {MAX_SIMULATED})"
    config = dataclasses.replace(SMALL, gmm_dtype=None)
    x = torch.randn(SMALL_TOKENS, config.dim, generator=torch.Generator().manual_seed(0))
    ref = MoE(config)(x)
    with simulated_mesh(shape) as mesh:
        out = apply_choice(MoE(config), mesh, params, x, input_layout, ep=ep).full_tensor()
    return f"{(out - ref).abs().max().item():.1e}" + (" (expert_parallel)" if ep else "")


def _apply_row(shape: tuple, choice) -> str:
    """Run the small block (fp32, 64 experts so every ep size of these meshes divides them) as the
    routed-experts row chose (``solver.ep_row.place_expert_row``: ``expert_parallel`` for an EP row)
    on a simulated mesh of ``shape`` and compare with one device."""
    if math.prod(shape) > MAX_SIMULATED:
        return f"not run (simulating {math.prod(shape)} ranks; at most {MAX_SIMULATED})"
    config = dataclasses.replace(SMALL, gmm_dtype=None, n_experts=64)
    x = torch.randn(SMALL_TOKENS, config.dim, generator=torch.Generator().manual_seed(0))
    ref = MoE(config)(x)
    row = expert_row(choice)
    with simulated_mesh(shape, names=[f"d{i}" for i in range(len(shape))]) as mesh:
        module = place_expert_row(MoE(config), mesh, choice)
        out = module(distribute_tensor(per_rank_copies(x), mesh, choice.input_layout)).full_tensor()
    how = f" (expert_parallel, ep on mesh dims {row.ep_dims})" if row.ep_dims else ""
    return f"{(out - ref).abs().max().item():.1e}" + how


def _meta_module(config: MoEConfig) -> MoE:
    """The block with meta parameters: sizes only (the DeepSeek-sized one would take GBs)."""
    with torch.device("meta"):
        return _NoInit(config)


class _NoInit(MoE):
    def init_weights(self, seed: int) -> None:  # meta tensors hold no values to draw
        pass


def table(rows: list[Row]) -> str:
    head = ("mesh", "rules", "variables", "vs upstream", "constraints", "solve s", "query s", "objective us",
            "vs upstream", "experts w1/w3/w2")
    up = {r.mesh: r for r in rows if r.rules == "upstream"}
    lines = [head]
    for r in rows:
        u = up[r.mesh]
        lines.append((r.mesh, r.rules, str(r.variables), f"{r.variables / u.variables:.2f}x", str(r.constraints),
                      f"{r.solve_s:.2f}", f"{r.query_s:.1f}", f"{r.objective_us:.1f}",
                      f"{r.objective_us / u.objective_us:.3f}x", r.experts))
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    out = ["| " + " | ".join(c.ljust(w) for c, w in zip(line, widths)) + " |" for line in lines]
    out.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="the small test config on (8,) and (2,4)")
    ap.add_argument("--cap", type=float, default=None,
                    help="per-rank parameter-memory cap as a fraction of the replicated parameter bytes (default: none)")
    ap.add_argument("--mesh", action="append", default=None, help="a mesh shape like 2x4 (repeatable)")
    ap.add_argument("--rules", action="append", default=None, choices=RULES,
                    help="a rule set to run (repeatable; default: all; 'upstream' is always run, the ratios' base)")
    args = ap.parse_args(argv)
    config, tokens = (SMALL, SMALL_TOKENS) if args.quick else (LITE, LITE_TOKENS)
    meshes = tuple(tuple(int(s) for s in m.split("x")) for m in args.mesh) if args.mesh else (
        MESHES[:2] if args.quick else MESHES)
    rule_sets = RULES if args.rules is None else tuple(r for r in RULES if r in args.rules or r == "upstream")
    rows = run(config, tokens, meshes, args.cap, rule_sets)
    print(f"config: {config}, tokens {tokens}, memory cap: "
          + ("none" if args.cap is None else f"{args.cap} x replicated parameter bytes"))
    print(table(rows))
    print()
    print("parameter layouts; applied = the small fp32 block run with them on a simulated mesh, max |out - one device|:")
    for r in rows:
        print(f"{r.mesh} {r.rules}: " + ", ".join(f"{k} {v}" for k, v in r.params.items()) + f"; applied: {r.applied}")


if __name__ == "__main__":
    main()

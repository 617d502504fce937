"""AutoParallel's two partial-move conventions, put into this package's solver (docs/solver.md,
"AutoParallel's free partial switch").

AutoParallel prices ``Replicate -> Partial`` as impossible and a switch of Partial kind
(``Partial(avg) -> Partial(sum)``) as free, and performs that switch as an all-reduce to
Replicate. Here the same trace, rows and ILP as ``benchmarks/solver_moe.py`` are solved with
those two conventions on top of this package's pricer ("gap" pricing), and the chosen plan is
then priced as performed (the switch as the all-reduce: :class:`dtensor_rules.solver.price.Pricer`'s
own pricing). Printed per rule set: the gap objective, the same plan priced as performed, the
optimum under the performed pricing, and every switch the plan makes. Modelled microseconds
per step, not AutoParallel's own cost model, so the numbers show the mechanism, not its ratios.

    python benchmarks/experiments/autoparallel_partial_gap.py            # DeepSeek-V2-Lite-like layer, mesh (4, 8)
    python benchmarks/experiments/autoparallel_partial_gap.py --quick    # the small block, mesh (2, 4)
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import Partial, Replicate, Shard

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import solver_moe as bench  # noqa: E402

import dtensor_rules  # noqa: E402
from dtensor_rules._upstream import TensorMeta  # noqa: E402
from dtensor_rules.solver import build_problem, query_graph, solve, total_cost, trace_joint  # noqa: E402
from dtensor_rules.solver.price import Pricer, partial_switch_dims  # noqa: E402
from dtensor_rules.testing import fake_world  # noqa: E402


class GapPricer(Pricer):
    """This package's prices, with AutoParallel's two conventions for partial targets."""

    def edge_us(self, meta: TensorMeta, src: tuple, dst: tuple) -> float:
        if src == dst:
            return 0.0
        if any(isinstance(s, Replicate) and isinstance(d, Partial) for s, d in zip(src, dst)):
            return math.inf  # "ban replicate -> partial"
        switched = partial_switch_dims(src, dst)
        if switched:  # no branch matches partial -> other partial: priced 0
            src = tuple(dst[m] if m in switched else p for m, p in enumerate(src))
        return super().edge_us(meta, src, dst)


def _pl(layout: tuple) -> str:
    return bench._pl(layout)


def run(quick: bool) -> None:
    config, tokens, shape = (bench.SMALL, bench.SMALL_TOKENS, (2, 4)) if quick else (bench.LITE, bench.LITE_TOKENS, (4, 8))
    model = bench._meta_module(config)
    x = torch.empty(tokens, config.dim, device="meta")
    jg = trace_joint(model, x)
    ph = [n.name for n in jg.graph.graph.nodes if n.op == "placeholder"]
    lay = (Shard(0),) * len(shape)
    with fake_world(math.prod(shape)):
        mesh = init_device_mesh("cpu", shape)
        for rules in ("ours", "upstream"):
            (dtensor_rules.uninstall if rules == "upstream" else dtensor_rules.install)()
            try:
                strategies = query_graph(jg.graph, mesh, {ph[-2]: [lay], ph[-1]: [lay]})
            finally:
                dtensor_rules.install()
            _report(rules, jg, strategies, mesh)


def _report(rules: str, jg, strategies, mesh: DeviceMesh) -> None:
    gap = build_problem(jg, strategies, GapPricer(mesh), mesh)
    performed = build_problem(jg, strategies, Pricer(mesh), mesh)
    plan = solve(gap)
    as_performed = total_cost(performed, plan.choice)
    optimum = solve(performed).objective_us
    print(f"{rules}: gap objective {plan.objective_us:.1f} us, the same plan as performed {as_performed:.1f} us "
          f"({as_performed / plan.objective_us:.3f}x), optimum as performed {optimum:.1f} us", flush=True)
    for e, g in zip(performed.edges, gap.edges):
        u = e.producer_layout[plan.choice[e.producer]]
        need = performed.choices[e.consumer].rows[plan.choice[e.consumer]].ins[e.arg]
        if u is not None and partial_switch_dims(e.layouts[u], need):
            print(f"   switch {e.producer} -> {e.consumer}[{e.arg}] {_pl(e.layouts[u])} -> {_pl(need)}: "
                  f"priced {g.cost[plan.choice[e.consumer]][u]:.1f} us, performed {e.cost[plan.choice[e.consumer]][u]:.1f} us")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="the small block on a (2, 4) mesh")
    run(ap.parse_args(argv).quick)


if __name__ == "__main__":
    main()

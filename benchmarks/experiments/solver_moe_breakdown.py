"""Why the solver picks what it picks on one mesh: the objective of ``ours+EP``'s choice and of the hand EP
split into compute and moves, with the dearest nodes and moves of each (docs/solver.md, issue 19 item 5).

    python benchmarks/experiments/solver_moe_breakdown.py 4x8     # the DeepSeek-V2-Lite-like layer of solver_moe.py

Same trace, pricing and ILP as ``benchmarks/solver_moe.py`` (no memory cap); modelled microseconds per step.
"""

from __future__ import annotations

import math
import sys
from collections import defaultdict
from pathlib import Path

from torch.distributed.device_mesh import init_device_mesh

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import solver_moe as bench  # noqa: E402

from dtensor_rules.solver import choose_placements, trace_joint  # noqa: E402
from dtensor_rules.testing import fake_world  # noqa: E402


def breakdown(c, top: int = 6) -> str:
    p, choice = c.problem, c.solution.choice
    compute = {n: p.choices[n].compute_us[o] for n, o in choice.items()}
    moves: dict[str, float] = defaultdict(float)
    for e in p.edges:
        u = e.producer_layout[choice[e.producer]]
        cost = math.inf if u is None else e.cost[choice[e.consumer]][u]
        if cost:
            moves[f"{e.producer} -> {e.consumer}[{e.arg}] {_pl(e.layouts[u])} -> {_pl(p.choices[e.consumer].rows[choice[e.consumer]].ins[e.arg])}"] += cost
    lines = [f"  objective {c.objective_us:.1f} us = compute {sum(compute.values()):.1f} + moves {sum(moves.values()):.1f}"]
    def row(n: str) -> str:
        r = p.choices[n].rows[choice[n]]
        return ", ".join(_pl(i) for i in r.ins) + " -> " + ", ".join("-" if o is None else _pl(o) for o in r.outs)

    lines += [f"    compute {v:8.1f}  {n}: {row(n)}" for n, v in sorted(compute.items(), key=lambda kv: -kv[1])[:top]]
    lines += [f"    move    {v:8.1f}  {n}" for n, v in sorted(moves.items(), key=lambda kv: -kv[1])[:top]]
    return "\n".join(lines)


def _pl(layout) -> str:
    """``bench._pl`` with the routed-rows labels told apart: TokenRows(d) unaligned (before dispatch), ExpertRows(d) aligned."""
    from dtensor_rules.solver.ep_rows import RoutedRows

    return "(" + ", ".join((f"ExpertRows({p.dim})" if p.aligned else f"TokenRows({p.dim})") if isinstance(p, RoutedRows)
                           else bench._pl((p,))[1:-1] for p in layout) + ")"


def main(shape_text: str) -> None:
    shape = tuple(int(s) for s in shape_text.split("x"))
    model = bench._meta_module(bench.LITE)
    import torch

    x = torch.empty(bench.LITE_TOKENS, bench.LITE.dim, device="meta")
    jg = trace_joint(model, x)
    with fake_world(math.prod(shape)):
        mesh = init_device_mesh("cpu", shape)
        for name, kw in (("ours+EP", dict(ep_rows=True)), ("hand EP", dict(hand_ep=bench.hand_ep_layout(len(shape))))):
            c = choose_placements(model, x, mesh, joint=jg, **kw)
            print(f"{shape} {name}: experts " + "/".join(bench._pl(c.params[w]) for w in ("w1", "w3", "w2")))
            print(breakdown(c), flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "4x8")

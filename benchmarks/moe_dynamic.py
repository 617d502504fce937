"""A dynamic-shape MoE training loop: per-step time with our rules vs upstream's, one run.

Twenty forward+backward steps of the sharded MoE block (``dtensor_rules.models``) where
every step routes differently (new tokens, so different tokens per expert) and the batch
size changes (so DTensor's sharding caches miss on each new shape, as they do in real MoE
training). Both sides run exactly the same steps on the same inputs (seeded per step).

Fairness: every loop (one side, all steps) runs in a FRESH process (simulated 2x2 mesh) or a
fresh gloo world (4 real ranks), so no cache, lazy import or allocator state carries over
from one loop to the next, and each loop first takes one untimed step on a batch size the
loop never uses (process-wide first-use costs are paid there, equally by both sides). Each
process uses one intra-op thread (on a 2-core shared machine more only add contention). The
loops run in ABBA order -- ours, upstream, upstream, ours, and again for ``--repeats 4`` (the
default; each side runs first in half of the pairs) -- so neither side is favoured
by running first or by a drift in the shared machine's load. A step's time on a side is its
fastest over that side's repeats (other jobs only ever add time; every repeat is a fresh
process, so each repeat's first occurrences are real cache misses); the per-repeat medians
(r-th loop of each side paired) are printed too, to show the run-to-run spread. Wall time is
the headline; this process's CPU time is printed beside it (less sensitive to other jobs).
In gloo mode a step takes its slowest rank's time.

Reported: the median per-step ratio ours/upstream over each batch size's FIRST occurrence
(cache misses: the unfavourable case; the max is printed as well) and over the repeats of a
batch size (warm caches). Experts compute in bf16 (upstream's ``_grouped_mm`` meta kernel
needs it).

Unfavourable case, apart (simulated mode): token counts that split unevenly over the 'ep'
ranks (``UNEVEN_BATCHES``). Upstream's ``_grouped_mm`` rule raises on them (the kernel's 16-byte
stride alignment), so no ratio exists: printed are each side's steps that ran, our median step
time, and upstream's error.

    python benchmarks/moe_dynamic.py                 # simulated 2x2 and gloo 4 ranks, 20 steps, 4 loops per side
    python benchmarks/moe_dynamic.py --mode simulated --steps 10 --repeats 4
    python benchmarks/moe_dynamic.py --json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from typing import Any, NamedTuple

import torch

BATCHES = (48, 64, 40, 64, 56, 48, 72, 40, 64, 56)  # tokens per step, cycled: 5 shapes, each seen 2+ times
WARMUP_TOKENS = 36  # not in BATCHES: every timed shape's first occurrence is still a cache miss
# the unfavourable case, simulated mode only: token counts the 2 'ep' ranks split unevenly (31/30,
# 17/16). Upstream's _grouped_mm rule ignores the kernel's 16-byte alignment for such shards and
# raises, so these steps are reported apart: our time per step and each side's outcome.
UNEVEN_BATCHES = (61, 33, 61, 33)


class Step(NamedTuple):
    tokens: int
    first: bool  # first occurrence of this batch size in the loop
    seconds: float  # wall
    cpu: float  # this process's CPU time (less sensitive to other jobs on a shared machine)
    error: str = ""  # uneven loop only: the step raised this (times are then nan)


def _model() -> Any:
    from dtensor_rules.models import MoE, MoEConfig

    model = MoE(MoEConfig(dim=64, hidden=128, n_experts=8, top_k=2, gmm_dtype=torch.bfloat16))
    model.init_weights(0)
    return model


def loop(mesh: Any, steps: int, batches: tuple[int, ...] = BATCHES) -> list[Step]:
    """``steps`` forward+backward steps of a freshly sharded model on ``mesh``; per-step wall time.

    With ``UNEVEN_BATCHES`` a step that raises is recorded (its error, nan times) and the loop goes on.
    """
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from dtensor_rules.models import shard_moe

    model = shard_moe(_model(), mesh)
    # untimed warm-up on a batch size the loop never uses: process-wide first-use costs (fake
    # mode, autograd, collectives) are paid here by each side, not by whichever side runs first
    x = distribute_tensor(torch.randn(WARMUP_TOKENS, 64), mesh, (Shard(0), Replicate()))
    model(x).float().pow(2).mean().backward()
    model.zero_grad(set_to_none=True)
    seen: set[int] = set()
    out = []
    for i in range(steps):
        tokens = batches[i % len(batches)]
        gen = torch.Generator().manual_seed(1000 + i)  # new tokens every step: new routing
        x = distribute_tensor(torch.randn(tokens, 64, generator=gen), mesh, (Shard(0), Replicate()))
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            model(x).float().pow(2).mean().backward()
        except RuntimeError as e:
            if batches is BATCHES:
                raise
            out.append(Step(tokens, tokens not in seen, math.nan, math.nan, str(e).splitlines()[0][:120]))
        else:
            out.append(Step(tokens, tokens not in seen, time.perf_counter() - t0, time.process_time() - c0))
        seen.add(tokens)
        model.zero_grad(set_to_none=True)
    return out


SIDES = ("ours", "upstream")


def order(repeats: int) -> list[str]:
    """ABBA...: ours, upstream, upstream, ours, ours, upstream, ..."""
    return [side for r in range(repeats) for side in (SIDES if r % 2 == 0 else SIDES[::-1])]


def side_loop(side: str, mesh: Any, steps: int, batches: tuple[int, ...] = BATCHES) -> list[Step]:
    """``loop`` with ``side``'s rules active (a fresh process: nothing cached yet either way)."""
    import dtensor_rules

    from dtensor_rules._upstream import clear_sharding_caches

    torch.set_num_threads(1)  # 2 shared cores: intra-op threads only add contention (4 gloo ranks)
    if side == "ours":
        dtensor_rules.install()  # (clears DTensor's sharding caches)
    else:
        dtensor_rules.uninstall()
        clear_sharding_caches()
    return loop(mesh, steps, batches)


def _simulated_process(side: str, steps: int, batches: tuple[int, ...] = BATCHES) -> list[Step]:
    from dtensor_rules.testing import simulated_mesh

    with simulated_mesh((2, 2), names=("ep", "tp")) as mesh:
        return side_loop(side, mesh, steps, batches)


def _gloo_rank(rank: int, world: int, side: str, steps: int) -> list[Step]:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("ep", "tp"))
    return side_loop(side, mesh, steps)


def run_side(mode: str, side: str, steps: int, batches: tuple[int, ...] = BATCHES) -> list[Step]:
    """One loop of ``side`` in a fresh process (simulated) or a fresh 4-rank gloo world."""
    if mode == "simulated":
        with torch.multiprocessing.get_context("spawn").Pool(1) as pool:
            return pool.apply(_simulated_process, (side, steps, batches))
    from dtensor_rules.testing import run_gloo

    per_rank = run_gloo(_gloo_rank, 4, side, steps, timeout=3600)
    # a step is as slow as its slowest rank
    return [Step(s[0].tokens, s[0].first, max(x.seconds for x in s), max(x.cpu for x in s)) for s in zip(*per_rank)]


def measure(mode: str, steps: int, repeats: int) -> dict[str, list[list[Step]]]:
    """``repeats`` loops per side, in ABBA order: {side: [loop, ...]}."""
    runs: dict[str, list[list[Step]]] = {side: [] for side in SIDES}
    for side in order(repeats):
        runs[side].append(run_side(mode, side, steps))
    return runs


def _ratios(ours: list[Step], upstream: list[Step], clock: str) -> tuple[list[float], list[float]]:
    """Per-step ours/upstream ratios of ``clock`` ("seconds" or "cpu"): (first occurrences, warm)."""
    pairs = [(o.first, getattr(o, clock) / getattr(u, clock)) for o, u in zip(ours, upstream)]
    return [r for first, r in pairs if first], [r for first, r in pairs if not first]


def _fastest(loops: list[list[Step]]) -> list[Step]:
    """Per step, the fastest of the repeats (wall and CPU separately): load only adds time."""
    return [Step(s[0].tokens, s[0].first, min(x.seconds for x in s), min(x.cpu for x in s)) for s in zip(*loops)]


def ratios(runs: dict[str, list[list[Step]]]) -> dict[str, Any]:
    """Median ours/upstream per-step ratio over first occurrences and over warm repeats.

    A step's time on a side is its fastest over that side's repeats (every repeat is a fresh
    process, so each one's first occurrences are real cache misses); per-repeat medians pair
    the r-th loop of each side (r even: ours ran first, r odd: upstream did).
    """
    out: dict[str, Any] = {}
    for clock, label in (("seconds", ""), ("cpu", "cpu_")):
        first, warm = _ratios(_fastest(runs["ours"]), _fastest(runs["upstream"]), clock)
        per_repeat = [_ratios(o, u, clock) for o, u in zip(runs["ours"], runs["upstream"])]
        out |= {
            f"{label}first_occurrence_median": statistics.median(first),
            f"{label}first_occurrence_max": max(first),
            f"{label}warm_median": statistics.median(warm) if warm else None,
            f"{label}per_repeat_first_median": [statistics.median(f) for f, _ in per_repeat],
            f"{label}per_repeat_warm_median": [statistics.median(w) if w else None for _, w in per_repeat],
        }
    for side in SIDES:
        out[f"{side}_median_loop_s"] = statistics.median(sum(s.seconds for s in loop) for loop in runs[side])
    return out


def uneven_outcome() -> dict[str, Any]:
    """One simulated loop per side over ``UNEVEN_BATCHES`` (fresh processes): per side, the median
    step time where the step ran and the distinct errors where it raised."""
    out: dict[str, Any] = {}
    for side in SIDES:
        loop_steps = run_side("simulated", side, len(UNEVEN_BATCHES), UNEVEN_BATCHES)
        ran = [s.seconds for s in loop_steps if not s.error]
        out[side] = {"steps": len(loop_steps), "ran": len(ran), "median_step_s": statistics.median(ran) if ran else None,
                     "errors": sorted({s.error for s in loop_steps if s.error})}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=("simulated", "gloo", "both"), default="both")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=4, help="loops per side, ABBA order (default 4)")
    ap.add_argument("--json", action="store_true", help="print one JSON document")
    args = ap.parse_args(argv)
    modes = {"simulated": "simulated 2x2", "gloo": "gloo 4 ranks (2x2)"}
    results: dict[str, Any] = {}
    for mode, name in modes.items():
        if args.mode in (mode, "both"):
            runs = measure(mode, args.steps, args.repeats)
            results[name] = {"runs": {k: [[s._asdict() for s in loop] for loop in v] for k, v in runs.items()},
                             **ratios(runs)}
    uneven = uneven_outcome() if args.mode in ("simulated", "both") else None
    if args.json:
        print(json.dumps({"torch": torch.__version__, "batches": BATCHES, "order": order(args.repeats),
                          "results": results, "uneven_batches": UNEVEN_BATCHES, "uneven": uneven}, indent=1))
        return 0
    print(f"torch {torch.__version__}; {args.steps} steps, batch sizes cycling {BATCHES}; each loop in a fresh "
          f"process, order {' '.join(order(args.repeats))}; ratio = ours / upstream of each step's fastest repeat\n")
    print("| setting | clock | first occurrence of a shape: median (max) | warm: median | per repeat: first / warm medians "
          "| median loop ours s | median loop upstream s |")
    print("|---|---|---|---|---|---|---|")
    for name, r in results.items():
        for clock, label in (("wall", ""), ("cpu", "cpu_")):
            warm = "-" if r[f"{label}warm_median"] is None else f"{r[f'{label}warm_median']:.2f}x"
            reps = ", ".join(f"{f:.2f}x / " + ("-" if w is None else f"{w:.2f}x")
                             for f, w in zip(r[f"{label}per_repeat_first_median"], r[f"{label}per_repeat_warm_median"]))
            print(f"| {name} | {clock} | {r[f'{label}first_occurrence_median']:.2f}x ({r[f'{label}first_occurrence_max']:.2f}x) "
                  f"| {warm} | {reps} | {r['ours_median_loop_s']:.1f} | {r['upstream_median_loop_s']:.1f} |")
    if uneven is not None:
        print(f"\nunfavourable: uneven token counts {UNEVEN_BATCHES} over the 2 'ep' ranks, simulated 2x2, one loop per side")
        for side, u in uneven.items():
            step = "-" if u["median_step_s"] is None else f"{u['median_step_s']:.3f} s"
            print(f"  {side}: {u['ran']}/{u['steps']} steps ran, median step {step}; errors: {u['errors'] or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

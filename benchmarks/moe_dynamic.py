"""A dynamic-shape MoE training loop: per-step time with our rules vs upstream's, one run.

Twenty forward+backward steps of the sharded MoE block (``dtensor_rules.models``) where
every step routes differently (new tokens, so different tokens per expert) and the batch
size changes (so DTensor's sharding caches miss on each new shape, as they do in real MoE
training). The same 20 steps run with our rules installed, then with upstream's, in the same
process (simulated 2x2 mesh) or the same gloo world (4 real ranks).

Reported: the median per-step time ratio ours/upstream over each batch size's FIRST
occurrence (cache misses: the unfavourable case) and over the repeats (warm caches).
Experts compute in bf16 (upstream's ``_grouped_mm`` meta kernel needs it).

    python benchmarks/moe_dynamic.py                 # simulated 2x2 and gloo 4 ranks
    python benchmarks/moe_dynamic.py --mode simulated --steps 10
    python benchmarks/moe_dynamic.py --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any, NamedTuple

import torch

BATCHES = (48, 64, 40, 64, 56, 48, 72, 40, 64, 56)  # tokens per step, cycled: 5 shapes, each seen 2+ times
WARMUP_TOKENS = 36  # not in BATCHES: every timed shape's first occurrence is still a cache miss


class Step(NamedTuple):
    tokens: int
    first: bool  # first occurrence of this batch size in the loop
    seconds: float


def _model() -> Any:
    from dtensor_rules.models import MoE, MoEConfig

    model = MoE(MoEConfig(dim=64, hidden=128, n_experts=8, top_k=2, gmm_dtype=torch.bfloat16))
    model.init_weights(0)
    return model


def loop(mesh: Any, steps: int) -> list[Step]:
    """``steps`` forward+backward steps of a freshly sharded model on ``mesh``; per-step wall time."""
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
        tokens = BATCHES[i % len(BATCHES)]
        gen = torch.Generator().manual_seed(1000 + i)  # new tokens every step: new routing
        x = distribute_tensor(torch.randn(tokens, 64, generator=gen), mesh, (Shard(0), Replicate()))
        t0 = time.perf_counter()
        model(x).float().pow(2).mean().backward()
        out.append(Step(tokens, tokens not in seen, time.perf_counter() - t0))
        seen.add(tokens)
        model.zero_grad(set_to_none=True)
    return out


def both_sides(mesh: Any, steps: int) -> dict[str, list[Step]]:
    import dtensor_rules

    from dtensor_rules._upstream import clear_sharding_caches

    dtensor_rules.install()  # (clears DTensor's sharding caches)
    ours = loop(mesh, steps)
    dtensor_rules.uninstall()  # (clears them again: upstream starts as cold as ours did)
    try:
        clear_sharding_caches()
        upstream = loop(mesh, steps)
    finally:
        dtensor_rules.install()
    return {"ours": ours, "upstream": upstream}


def _gloo_rank(rank: int, world: int, steps: int) -> dict[str, list[Step]]:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("ep", "tp"))
    return both_sides(mesh, steps)


def ratios(sides: dict[str, list[Step]]) -> dict[str, Any]:
    """Median ours/upstream per-step ratio over first occurrences and over warm repeats."""
    pairs = list(zip(sides["ours"], sides["upstream"]))
    first = [o.seconds / u.seconds for o, u in pairs if o.first]
    warm = [o.seconds / u.seconds for o, u in pairs if not o.first]
    return {
        "first_occurrence_median": statistics.median(first),
        "first_occurrence_max": max(first),
        "warm_median": statistics.median(warm) if warm else None,
        "ours_total_s": sum(s.seconds for s in sides["ours"]),
        "upstream_total_s": sum(s.seconds for s in sides["upstream"]),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=("simulated", "gloo", "both"), default="both")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--json", action="store_true", help="print one JSON document")
    args = ap.parse_args(argv)
    results: dict[str, Any] = {}
    if args.mode in ("simulated", "both"):
        from dtensor_rules.testing import simulated_mesh

        with simulated_mesh((2, 2), names=("ep", "tp")) as mesh:
            sides = both_sides(mesh, args.steps)
        results["simulated 2x2"] = {"steps": {k: [s._asdict() for s in v] for k, v in sides.items()}, **ratios(sides)}
    if args.mode in ("gloo", "both"):
        from dtensor_rules.testing import run_gloo

        per_rank = run_gloo(_gloo_rank, 4, args.steps, timeout=3600)
        # a step is as slow as its slowest rank
        sides = {k: [Step(s[0].tokens, s[0].first, max(x.seconds for x in s)) for s in zip(*(r[k] for r in per_rank))]
                 for k in ("ours", "upstream")}
        results["gloo 4 ranks (2x2)"] = {"steps": {k: [s._asdict() for s in v] for k, v in sides.items()}, **ratios(sides)}
    if args.json:
        print(json.dumps({"torch": torch.__version__, "batches": BATCHES, "results": results}, indent=1))
        return 0
    print(f"torch {torch.__version__}; {args.steps} steps, batch sizes cycling {BATCHES}; ratio = ours / upstream\n")
    print("| setting | first occurrence of a shape: median (max) | warm: median | total ours s | total upstream s |")
    print("|---|---|---|---|---|")
    for name, r in results.items():
        warm = "-" if r["warm_median"] is None else f"{r['warm_median']:.2f}x"
        print(f"| {name} | {r['first_occurrence_median']:.2f}x ({r['first_occurrence_max']:.2f}x) | {warm} | "
              f"{r['ours_total_s']:.1f} | {r['upstream_total_s']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

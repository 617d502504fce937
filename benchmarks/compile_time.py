"""Compile time of the sharded MoE block: upstream's strategy pricing vs ``hinted_strategy_costs``.

The block of docs/compile.md's recipe (``shard_moe`` on an ("ep", "tp") = (2, 2) mesh, 4 real gloo
ranks, ``torch.compile(backend="aot_eager", dynamic=True)``, unbacked token count) is compiled
twice in each round, once with every default patch and once with ``hinted_strategy_costs`` off
(upstream prices its candidate strategies in sympy), in ABBA order. Each compile is timed on rank
0 as the wall time of its first forward+backward (the compile) and its second call (a new token
count on the same graph). The table gives the seconds and ours / upstream's; the outputs of both
must be equal (the patch changes prices, never results).

    python benchmarks/compile_time.py            # 2 rounds (4 compiles), a few minutes on 2 cores
    python benchmarks/compile_time.py --rounds 1

The unfavourable case for the patch is a mesh where upstream's expansion has few candidates
(a 1-D mesh: ``--mesh 4``): there is less sympy to save.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time

import torch

from dtensor_rules.testing import run_gloo

TOKENS = (20, 33)


def _worker(rank: int, world: int, mesh_shape: tuple[int, ...], order: list[str]) -> dict:
    import logging

    import dtensor_rules
    from dtensor_rules import patches
    from dtensor_rules.models import MoE, MoEConfig, shard_moe
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    names = ("ep", "tp")[: len(mesh_shape)]
    mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=names)
    config = MoEConfig(dim=16, hidden=32, n_experts=4, top_k=2, gmm_dtype=torch.bfloat16)
    times: dict[str, list[tuple[float, float]]] = {"hinted": [], "upstream": []}
    outputs: dict[str, torch.Tensor] = {}
    for pricing in order:
        wanted = patches.defaults() if pricing == "hinted" else [n for n in patches.defaults()
                                                                 if n != "hinted_strategy_costs"]
        dtensor_rules.install(patches=wanted)
        torch._dynamo.reset()
        model = MoE(config)
        model.init_weights(0)
        step = torch.compile(shard_moe(model, mesh), backend="aot_eager", dynamic=True)
        laps = []
        for n in TOKENS:
            x = torch.randn(n, config.dim, generator=torch.Generator().manual_seed(n))
            xd = distribute_tensor(x, mesh, (Shard(0),) + (Replicate(),) * (len(mesh_shape) - 1))
            torch._dynamo.decorators.mark_unbacked(xd, 0)
            t0 = time.perf_counter()
            out = step(xd)
            out.float().pow(2).mean().backward()
            laps.append(time.perf_counter() - t0)
            outputs[pricing] = out.full_tensor()
        times[pricing].append((laps[0], laps[1]))
    dtensor_rules.install()
    return {"times": times, "equal": torch.equal(outputs["hinted"], outputs["upstream"])}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--mesh", default="2x2", help="2x2 (default) or 4 (the unfavourable 1-D case)")
    args = ap.parse_args(argv)
    mesh_shape = tuple(int(s) for s in args.mesh.split("x"))
    order = [p for r in range(args.rounds) for p in (("upstream", "hinted") if r % 2 == 0 else ("hinted", "upstream"))]
    res = run_gloo(_worker, 4, mesh_shape, order, timeout=3600)[0]
    t = res["times"]
    print(f"{datetime.date.today()}, torch {torch.__version__}, mesh {mesh_shape}, 4 gloo ranks, "
          f"{args.rounds} ABBA round(s), rank 0, median seconds; outputs equal: {res['equal']}")
    print("| call | upstream pricing | hinted_strategy_costs | hinted / upstream |")
    print("|---|---|---|---|")
    for i, what in enumerate((f"compile + first step ({TOKENS[0]} tokens)", f"second step ({TOKENS[1]} tokens)")):
        up = statistics.median(x[i] for x in t["upstream"])
        ours = statistics.median(x[i] for x in t["hinted"])
        print(f"| {what} | {up:.1f} | {ours:.1f} | {ours / up:.2f}x |")
    if not res["equal"]:
        raise SystemExit("the two pricings gave different outputs")


if __name__ == "__main__":  # the spawned ranks import this file: launch only from the main process
    main()

"""Planning time and plan cost: dtensor_rules planner vs upstream torch's graph planner (uncached).

Same random (src, dst) pairs (random placements incl. Partial, random shard orders), same run:
  * time: upstream ``_gen_transform_infos_non_cached`` under ``use_min_cost_redistribution_plan``
    with its planner cache cleared before every pair; ours ``plan()`` with our plan cache cleared.
  * cost under upstream's own cost function: upstream plan = sum of ``one_step_redistribute_cost``
    over its path; our plan = the same function on every single-mesh-dim step, and for flattened
    steps upstream's formulas on the combined group (``Topology.upstream_like``; see docs).
  * cost under a two-tier topology (``Topology.node_aware(gpus_per_node=4)``): both plans priced
    by our alpha-beta model; ours is planned for that topology.

usage: python benchmarks/planner_vs_upstream.py [--quick] [--n N] [--seed S]
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
import time

os.environ.setdefault("DTENSOR_RULES_NO_INSTALL", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import DeviceMesh  # noqa: E402
from torch.distributed.tensor import Partial, Replicate, Shard  # noqa: E402
from torch.distributed.tensor import _redistribute as R  # noqa: E402
from dtensor_rules._upstream import DTensorSpec, one_step_redistribute_cost, ShardOrderEntry, TensorMeta

from dtensor_rules.redistribute import Layout, Topology, clear_plan_cache, plan  # noqa: E402
from dtensor_rules.redistribute.planner import PlanContext  # noqa: E402

CONFIGS = [((2, 4), (256, 256, 256)), ((2, 2, 2), (256, 256, 256)), ((2, 2, 2), (64, 128, 128, 64)),
           ((4, 4, 4), (256, 256, 256)), ((4, 4, 4), (64, 128, 128, 64)),
           ((2, 2, 2, 2), (256, 256, 256)), ((2, 2, 2, 2), (64, 128, 128, 64))]


def rand_state(rng, mesh_ndim, tensor_ndim, p_rep=0.3, p_par=0.0):
    """Random placements and a random shard order (as in the reference harness)."""
    pl = []
    for _ in range(mesh_ndim):
        u = rng.random()
        pl.append(Replicate() if u < p_rep else Partial() if u < p_rep + p_par else Shard(rng.randrange(tensor_ndim)))
    order = {}
    for m, p in enumerate(pl):
        if isinstance(p, Shard):
            order.setdefault(p.dim, []).append(m)
    for ms in order.values():
        rng.shuffle(ms)
    return tuple(pl), {d: tuple(ms) for d, ms in sorted(order.items())}


def spec_of(mesh, layout: Layout, meta) -> DTensorSpec:
    return DTensorSpec(mesh, layout.placements, tensor_meta=meta, shard_order=layout.shard_order(),
                       use_strided_shard_as_shard_order=False)


def upstream_path(src: Layout, infos, ndim: int) -> list[Layout]:
    cur = list(src.placements)
    d = R.DTensorRedistributePlanner._ShardOrder_to_dict(src.shard_order())
    out = [src]
    for info in infos:
        R._update_shard_order_and_placements(info, cur, d)
        order = {e.tensor_dim: e.mesh_dims for e in R.DTensorRedistributePlanner._dict_to_ShardOrder(d)}
        out.append(Layout.from_placements(cur, ndim, order))
    return out


def price_path(ctx: PlanContext, path: list[Layout]) -> float:
    """Our alpha-beta cost of a path of single-mesh-dim transitions."""
    tot = 0.0
    for a, b in zip(path, path[1:]):
        diff = [m for m, (x, y) in enumerate(zip(a.placements, b.placements)) if x != y]
        if not diff:
            continue
        (m,) = diff
        x, y = a.placements[m], b.placements[m]
        if x.is_shard() and y.is_replicate():
            tot += ctx.cost("all_gather", (m,), ctx.local_bytes(b.orders))
        elif x.is_shard() and y.is_shard():
            tot += ctx.cost("all_to_all", (m,), ctx.local_bytes(a.orders))
        elif x.is_partial() and y.is_replicate():
            tot += ctx.cost("all_reduce", (m,), ctx.local_bytes(a.orders))
        elif x.is_partial() and y.is_shard():
            tot += ctx.cost("reduce_scatter", (m,), ctx.local_bytes(a.orders))
    return tot


def our_upstream_cost(mesh, p, meta, ndim) -> float:
    """Our plan under upstream's cost: its own function on single-dim steps, its formulas on flattened groups."""
    tot, prev = 0.0, Layout.from_state(p.src, len(p.mesh_shape))
    for s in p.steps:
        nxt = Layout.from_state(s.after, len(p.mesh_shape))
        tot += one_step_redistribute_cost(spec_of(mesh, prev, meta), spec_of(mesh, nxt, meta)) if len(s.mesh_dims) == 1 else s.cost_us
        prev = nxt
    return tot


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="8 pairs per config")
    ap.add_argument("--n", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    n_pairs = args.n or (8 if args.quick else 25)
    dist.init_process_group("fake", rank=0, world_size=64)
    rows = []
    for mesh_shape, shape in CONFIGS:
        mesh = DeviceMesh("cpu", torch.arange(math.prod(mesh_shape)).reshape(mesh_shape))
        t = torch.empty(shape, device="meta")
        meta = TensorMeta(t.shape, t.stride(), torch.float32)
        up_topo = Topology.upstream_like(mesh_shape)
        two = Topology.node_aware(mesh_shape, gpus_per_node=4)
        ctx2 = PlanContext(mesh_shape, shape, 4, two)
        rng = random.Random(args.seed * 1000 + len(mesh_shape) * 10 + len(shape))
        tu, to, worse_up, better_up, better_two, worse_two = [], [], 0, 0, 0, 0
        for _ in range(n_pairs):
            spl, so = rand_state(rng, len(mesh_shape), len(shape), p_par=0.15)
            dpl, do = rand_state(rng, len(mesh_shape), len(shape), p_par=0.05)
            src = Layout.from_placements(spl, len(shape), so)
            dst = Layout.from_placements(dpl, len(shape), do)
            s_spec, d_spec = spec_of(mesh, src, meta), spec_of(mesh, dst, meta)
            R.clear_redistribute_planner_cache()
            R._gen_transform_infos.cache_clear()
            t0 = time.perf_counter()
            with R.use_min_cost_redistribution_plan(True):
                infos = R._gen_transform_infos_non_cached(s_spec, d_spec)
            tu.append(time.perf_counter() - t0)
            clear_plan_cache()
            t0 = time.perf_counter()
            ours = plan(mesh_shape, shape, torch.float32, spl, dpl, src_device_order=so, dst_device_order=do, topology=up_topo)
            to.append(time.perf_counter() - t0)
            path = upstream_path(src, infos, len(shape))
            assert path[-1] == dst, "upstream plan did not reach dst"
            up_cost = sum(one_step_redistribute_cost(spec_of(mesh, a, meta), spec_of(mesh, b, meta)) for a, b in zip(path, path[1:]))
            our_cost = our_upstream_cost(mesh, ours, meta, len(shape))
            worse_up += our_cost > up_cost * (1 + 1e-9) + 1e-9
            better_up += our_cost < up_cost * (1 - 1e-9) - 1e-9
            ours2 = plan(mesh_shape, shape, torch.float32, spl, dpl, src_device_order=so, dst_device_order=do, topology=two)
            up2 = price_path(ctx2, path)
            better_two += ours2.cost_us < up2 * (1 - 1e-9) - 1e-9
            worse_two += ours2.cost_us > up2 * (1 + 1e-9) + 1e-9
        row = dict(mesh=mesh_shape, ndim=len(shape), n=n_pairs, up_med=1e3 * statistics.median(tu), up_p99=1e3 * pct(tu, 0.99),
                   our_med=1e3 * statistics.median(to), our_p99=1e3 * pct(to, 0.99),
                   worse_up=worse_up, better_up=better_up, better_two=better_two, worse_two=worse_two)
        row["ratio"] = row["up_med"] / row["our_med"]
        rows.append(row)
        print(row, file=sys.stderr, flush=True)
    print("| mesh | tensor | pairs | upstream median ms | upstream p99 ms | ours median ms | ours p99 ms | median speedup "
          "| upstream-cost: ours costlier / cheaper | two-tier: ours cheaper / costlier |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mesh']} | {r['ndim']}-D | {r['n']} | {r['up_med']:.2f} | {r['up_p99']:.2f} | {r['our_med']:.2f} | "
              f"{r['our_p99']:.2f} | {r['ratio']:.1f}x | {r['worse_up']} / {r['better_up']} | "
              f"{r['better_two']} ({100 * r['better_two'] / r['n']:.0f}%) / {r['worse_two']} |")
    tot = sum(r["n"] for r in rows)
    b2 = sum(r["better_two"] for r in rows)
    print(f"| all | | {tot} | | | | | | {sum(r['worse_up'] for r in rows)} / {sum(r['better_up'] for r in rows)} | "
          f"{b2} ({100 * b2 / tot:.0f}%) / {sum(r['worse_two'] for r in rows)} |")


if __name__ == "__main__":
    main()

"""Planning time and plan cost: dtensor_rules planner vs upstream torch's graph planner, one run, ratios.

Same random (src, dst) pairs (random placements incl. Partial, random shard orders), same run:
  * uncached time: upstream ``_gen_transform_infos_non_cached`` under ``use_min_cost_redistribution_plan``
    with its planner cache cleared before every pair; ours ``plan()`` with ``clear_plan_cache()`` first.
  * cached time: the second identical call right after (same argument objects), one call timed per
    pair as the reference harness does (upstream: ``_gen_transform_infos``, its ``functools.cache``);
    and a tight loop (``timeit``, best of 5) on one pair per config. Ours also with fresh, equal
    list/dict arguments (the layout-cache path; upstream has no such path: a new spec re-hashes).
  * cost under upstream's own cost function: upstream plan = sum of ``one_step_redistribute_cost``
    over its path; our plan = the same function on every single-mesh-dim step, and for flattened
    steps upstream's formulas on the combined group (``Topology.upstream_like``; see docs).
  * cost under a two-tier topology (``Topology.node_aware(gpus_per_node=4)``): both plans priced
    by our alpha-beta model; ours is planned for that topology.

Every mesh has at least one uneven shape (dims 33, 49, 97, 129: shards differ by rank), and the
last config is labelled unfavourable: dims smaller than the world size (our bound is weakest there).

usage: python benchmarks/planner_vs_upstream.py [--quick] [--n N] [--seed S] [--only MESH]

``--quick`` is a smoke run (under a minute on a 2-core machine): 4 pairs per config and none of
the 4-D mesh x 4-D tensor configs, where upstream's planner takes seconds per pair. Its numbers
are not the ones docs/comparison.md reports. stdout carries the tables; stderr one progress
line per config.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
import time
import timeit

os.environ.setdefault("DTENSOR_RULES_NO_INSTALL", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import DeviceMesh  # noqa: E402
from torch.distributed.tensor import Partial, Replicate, Shard  # noqa: E402
from dtensor_rules._upstream import DTensorSpec, one_step_redistribute_cost, TensorMeta  # noqa: E402
from dtensor_rules._upstream import planner as upstream  # noqa: E402  (upstream's private planner, behind the adapter)

from dtensor_rules.redistribute import Layout, Topology, clear_plan_cache, plan  # noqa: E402
from dtensor_rules.redistribute.planner import PlanContext  # noqa: E402

EVEN3, EVEN4, UNEVEN3, UNEVEN4 = (256, 256, 256), (64, 128, 128, 64), (33, 97, 129), (33, 49, 97, 129)
CONFIGS = [((2, 4), EVEN3, "even"), ((2, 4), UNEVEN3, "uneven"),
           ((2, 2, 2), EVEN3, "even"), ((2, 2, 2), EVEN4, "even"), ((2, 2, 2), UNEVEN4, "uneven"),
           ((4, 4, 4), EVEN3, "even"), ((4, 4, 4), EVEN4, "even"), ((4, 4, 4), UNEVEN4, "uneven"),
           ((2, 2, 2, 2), EVEN3, "even"), ((2, 2, 2, 2), EVEN4, "even"), ((2, 2, 2, 2), UNEVEN4, "uneven"),
           ((2, 2, 2, 2), (3, 5, 97, 129), "unfavourable: dims < world")]


QUICK_PAIRS = 4


def heavy(mesh_shape: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    """Upstream's planner takes seconds per pair here (4-D mesh, 4-D tensor): left out of --quick."""
    return len(mesh_shape) >= 4 and len(shape) >= 4


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


def as_permutation(order: dict[int, tuple[int, ...]], mesh_ndim: int) -> tuple[int, ...]:
    """The same device order as one permutation of the mesh dims, major first: per-dim orders use disjoint mesh dims."""
    seq = [m for _, ms in sorted(order.items()) for m in ms]
    return tuple(seq + [m for m in range(mesh_ndim) if m not in seq])


def spec_of(mesh, layout: Layout, meta) -> DTensorSpec:
    return DTensorSpec(mesh, layout.placements, tensor_meta=meta, shard_order=layout.shard_order(),
                       use_strided_shard_as_shard_order=False)


def upstream_path(src: Layout, infos, ndim: int) -> list[Layout]:
    walked = upstream.walk_path(src.placements, src.shard_order(), infos)
    return [src] + [Layout.from_placements(pl, ndim, order) for pl, order in walked[1:]]


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


def _one_call(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _loop_us(fn, number: int = 2000) -> float:
    """Best-of-5 per-call time of a tight loop, in us."""
    return 1e6 * min(timeit.repeat(fn, number=number, repeat=5)) / number


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true",
                    help=f"smoke run: {QUICK_PAIRS} pairs per config, without the 4-D mesh x 4-D tensor configs")
    ap.add_argument("--n", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", default=None, help="run only configs on this mesh, e.g. 2x2x2x2")
    args = ap.parse_args()
    n_pairs = args.n or (QUICK_PAIRS if args.quick else 25)
    configs = [c for c in CONFIGS if not (args.only and "x".join(map(str, c[0])) != args.only)]
    if args.quick:
        skipped = [c for c in configs if heavy(c[0], c[1])]
        configs = [c for c in configs if not heavy(c[0], c[1])]
        if skipped:
            print(f"planner_vs_upstream: --quick leaves out {len(skipped)} 4-D mesh x 4-D tensor config(s) "
                  "(upstream takes seconds per pair there); run without --quick for them", file=sys.stderr)
    dist.init_process_group("fake", rank=0, world_size=64)
    up_cached = upstream.cached_planner()  # upstream's functools.cache'd function itself: no wrapper timed
    rows = []
    for i, (mesh_shape, shape, label) in enumerate(configs, 1):
        mesh = DeviceMesh("cpu", torch.arange(math.prod(mesh_shape)).reshape(mesh_shape))
        t = torch.empty(shape, device="meta")
        meta = TensorMeta(t.shape, t.stride(), torch.float32)
        up_topo = Topology.upstream_like(mesh_shape)
        two = Topology.node_aware(mesh_shape, gpus_per_node=4)
        ctx2 = PlanContext(mesh_shape, shape, 4, two)
        rng = random.Random(args.seed * 1000 + len(mesh_shape) * 10 + len(shape))
        tu, to, cu, co, cf, worse_up, better_up, better_two, worse_two = [], [], [], [], [], 0, 0, 0, 0
        for _ in range(n_pairs):
            spl, so = rand_state(rng, len(mesh_shape), len(shape), p_par=0.15)
            dpl, do = rand_state(rng, len(mesh_shape), len(shape), p_par=0.05)
            src = Layout.from_placements(spl, len(shape), so)
            dst = Layout.from_placements(dpl, len(shape), do)
            s_spec, d_spec = spec_of(mesh, src, meta), spec_of(mesh, dst, meta)
            upstream.clear_planner_caches()
            t0 = time.perf_counter()
            with upstream.min_cost_planning():
                infos = upstream.plan_uncached(s_spec, d_spec)
            tu.append(time.perf_counter() - t0)
            with upstream.min_cost_planning():
                up_cached(s_spec, d_spec)  # fills upstream's cache
                cu.append(_one_call(lambda: up_cached(s_spec, d_spec)))
            so_r, do_r = as_permutation(so, len(mesh_shape)), as_permutation(do, len(mesh_shape))  # the orders as immutable tuples
            assert Layout.from_placements(spl, len(shape), so_r) == src and Layout.from_placements(dpl, len(shape), do_r) == dst
            call = lambda: plan(mesh_shape, shape, torch.float32, spl, dpl, src_device_order=so_r, dst_device_order=do_r, topology=up_topo)
            clear_plan_cache()
            t0 = time.perf_counter()
            ours = call()
            to.append(time.perf_counter() - t0)
            co.append(_one_call(call))
            cf.append(_one_call(lambda: plan(list(mesh_shape), list(shape), torch.float32, list(spl), list(dpl),
                                             src_device_order=dict(so), dst_device_order=dict(do), topology=up_topo)))
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
        with upstream.min_cost_planning():
            loop_up = _loop_us(lambda: up_cached(s_spec, d_spec))
        loop_ours = _loop_us(call)
        row = dict(mesh=mesh_shape, shape=shape, label=label, n=n_pairs,
                   up_med=1e3 * statistics.median(tu), up_p99=1e3 * pct(tu, 0.99),
                   our_med=1e3 * statistics.median(to), our_p99=1e3 * pct(to, 0.99),
                   cu=1e6 * statistics.median(cu), co=1e6 * statistics.median(co), cf=1e6 * statistics.median(cf),
                   loop_up=loop_up, loop_ours=loop_ours,
                   worse_up=worse_up, better_up=better_up, better_two=better_two, worse_two=worse_two)
        row["ratio"] = row["up_med"] / row["our_med"]
        row["ratio_p99"] = row["up_p99"] / row["our_p99"]
        rows.append(row)
        print(f"planner_vs_upstream: {i}/{len(configs)} mesh {row['mesh']} tensor {row['shape']} ({label}): "
              f"{n_pairs} pairs, median upstream {row['up_med']:.1f} ms, ours {row['our_med']:.2f} ms",
              file=sys.stderr, flush=True)
    print("Uncached planning (median / p99 over the pairs; speedup = upstream / ours):\n")
    print("| mesh | tensor | kind | pairs | upstream median ms | upstream p99 ms | ours median ms | ours p99 ms "
          "| median speedup | p99 speedup | upstream-cost: ours costlier / cheaper | two-tier: ours cheaper / costlier |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mesh']} | {r['shape']} | {r['label']} | {r['n']} | {r['up_med']:.2f} | {r['up_p99']:.2f} | "
              f"{r['our_med']:.2f} | {r['our_p99']:.2f} | {r['ratio']:.1f}x | {r['ratio_p99']:.1f}x | "
              f"{r['worse_up']} / {r['better_up']} | {r['better_two']} ({100 * r['better_two'] / r['n']:.0f}%) / {r['worse_two']} |")
    tot = sum(r["n"] for r in rows)
    b2 = sum(r["better_two"] for r in rows)
    print(f"| all | | | {tot} | | | | | | | {sum(r['worse_up'] for r in rows)} / {sum(r['better_up'] for r in rows)} | "
          f"{b2} ({100 * b2 / tot:.0f}%) / {sum(r['worse_two'] for r in rows)} |")
    print("\nCached plan (us; ratio = ours / upstream, lower is better):\n")
    print("| mesh | tensor | upstream 1 call | ours 1 call (same args) | ratio | ours 1 call (fresh equal lists/dicts) "
          "| upstream loop | ours loop | loop ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mesh']} | {r['shape']} | {r['cu']:.2f} | {r['co']:.2f} | {r['co'] / r['cu']:.2f}x | {r['cf']:.1f} | "
              f"{r['loop_up']:.2f} | {r['loop_ours']:.2f} | {r['loop_ours'] / r['loop_up']:.2f}x |")
    cu = statistics.median(r["cu"] for r in rows)
    co = statistics.median(r["co"] for r in rows)
    print(f"\ncached, 1 call, median over configs: upstream {cu:.2f} us, ours {co:.2f} us, ours/upstream {co / cu:.2f}x")
    loops = [r["loop_ours"] / r["loop_up"] for r in rows]
    print(f"cached, tight loop, ours/upstream: median {statistics.median(loops):.2f}x, max {max(loops):.2f}x (target <= 2x)")
    for r in rows:
        if r["mesh"] == (2, 2, 2, 2) and r["label"] == "uneven":
            print(f"(2,2,2,2) x {r['shape']} uneven: median speedup {r['ratio']:.1f}x, p99 speedup {r['ratio_p99']:.1f}x "
                  f"(upstream p99 {r['up_p99']:.1f} ms, ours p99 {r['our_p99']:.1f} ms)")


if __name__ == "__main__":
    main()

"""Cold sharding-propagation cost per op: our rules vs upstream's, same process, same inputs.

For every op family we register, a realistic MoE-shaped call (bf16 activations, T tokens,
64 experts, top-8 routing) is propagated on fake-process-group meshes (8,), (8,8), (8,8,8)
and (4,4,4,4) with the sharding caches cleared before each call, first with our rules
installed, then with upstream's. No rank runs: only DTensor's sharding propagation
(strategy expansion, fake-tensor output metadata, min-cost selection) is timed.

Cases are labelled: ``even`` (token count divisible by every mesh size: the flattering
case), ``uneven`` (T = 4099: uneven shards on every mesh dim), ``many`` (cat of 6-12 inputs,
Replicate / Partial / sharded), ``many-moves`` (cat of 6 and 12 token shards along the sharded
dim: every input must move, so dispatch searches), ``2-dim`` (tokens sharded over two mesh
dims), ``moves`` (no strategy takes the inputs as they are: a redistribution must be chosen).
All but ``even`` are unfavourable to us. Our rules' row memos (cat, slice_scatter) are cleared with DTensor's caches. Printed: per case and mesh the minimum of
the timed repeats (ours and upstream alternate call by call, so load on the shared machine
hits both; the minimum is the least disturbed estimate), ours/upstream ratio, and the number of strategies the min-cost selection
chose from (ours/upstream); then, per mesh, the median and max ratio, and how each side's
time grows from the 8-rank to the 512-rank mesh.

    python benchmarks/propagation_cost.py              # the full table (minutes on 2 cores)
    python benchmarks/propagation_cost.py --quick      # (8,) and (8,8,8) only, five repeats
    python benchmarks/propagation_cost.py --json       # one JSON document on stdout
    python benchmarks/propagation_cost.py --mesh 2x2x2 --mesh 8x8x8 --repeats 5 --op aten.cat --op index_put
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard

import dtensor_rules
from dtensor_rules._upstream import (
    clear_sharding_caches,
    compute_local_shape_and_global_offset,
    ensure_prims_fma,
    propagate,
    recording_strategy_counts,
    unwrap_to_op_info,
)
from dtensor_rules.op_rules.slicing import clear_row_caches
from dtensor_rules.testing import fake_world

aten = torch.ops.aten
MESHES: tuple[tuple[int, ...], ...] = ((8,), (8, 8), (8, 8, 8), (4, 4, 4, 4))
E, K, D, H = 64, 8, 512, 1024  # experts, top-k, model dim, expert hidden dim
SLOW_RATIO = 2.0  # cases slower than this many times upstream are listed by name under the table


class Case(NamedTuple):
    """One call to propagate: ``build(mesh) -> (args, kwargs)`` of DTensors on meta tensors."""

    op: Any
    label: str  # even | uneven | many | 2-dim
    build: Callable[[DeviceMesh], tuple[tuple[Any, ...], dict[str, Any]]]


class Row(NamedTuple):
    op: str
    label: str
    mesh: str
    ours_ms: float | None
    upstream_ms: float | None
    ours_strategies: int | None
    upstream_strategies: int | None
    note: str


def _dt(mesh: DeviceMesh, shape: Sequence[int], tokens: Placement | None = None, dtype: torch.dtype = torch.bfloat16,
        extra: Placement | None = None) -> DTensor:
    """A DTensor of ``shape``: ``tokens`` on mesh dim 0 (``extra`` on mesh dim 1), Replicate elsewhere."""
    pl: list[Placement] = [Replicate()] * mesh.ndim
    if tokens is not None:
        pl[0] = tokens
    if extra is not None and mesh.ndim > 1:
        pl[1] = extra
    local, _ = compute_local_shape_and_global_offset(shape, mesh.shape, [0] * mesh.ndim, pl)
    stride = torch.empty(shape, device="meta").stride()
    t = torch.empty(local, dtype=dtype, device="meta")
    return DTensor.from_local(t, mesh, pl, run_check=False, shape=torch.Size(shape), stride=stride)


def cases() -> list[Case]:
    """One or more MoE-shaped calls per op family (out=/in-place overloads share their rule)."""
    S0, S1, R = Shard(0), Shard(1), None
    out: list[Case] = []
    for label, T in (("even", 4096), ("uneven", 4099)):
        def c(op: Any, build: Callable[[DeviceMesh], tuple[tuple[Any, ...], dict[str, Any]]], lab: str = label) -> None:
            out.append(Case(op, lab, build))

        c(aten._grouped_mm.default, lambda m, T=T: ((_dt(m, (T, D), S0), _dt(m, (E, D, H)), _dt(m, (E,), R, torch.int32)), {}))
        c(aten._softmax_backward_data.default,
          lambda m, T=T: ((_dt(m, (T, E), S0), _dt(m, (T, E), S0), -1, torch.bfloat16), {}))
        c(torch.ops.prims.fma.default, lambda m, T=T: ((_dt(m, (T, D), S0), _dt(m, (T, D), S0), _dt(m, (D,))), {}))
        c(aten.sort.stable, lambda m, T=T: ((_dt(m, (T, E), S0),), {"stable": True, "dim": -1}))
        c(aten.argsort.stable, lambda m, T=T: ((_dt(m, (T * K,), R, torch.int64),), {"stable": True}))
        c(aten.topk.default, lambda m, T=T: ((_dt(m, (T, E), S0), K, -1), {}))
        c(aten.cat.default, lambda m, T=T: (([_dt(m, (T, D), S0), _dt(m, (T, D), S0)], 1), {}))
        c(aten.cumsum.default, lambda m, T=T: ((_dt(m, (T, E), S0, torch.int64), 1), {}))
        c(aten.gather.default, lambda m, T=T: ((_dt(m, (T, E), S0), 1, _dt(m, (T, K), S0, torch.int64)), {}))
        c(aten.scatter_add.default, lambda m, T=T: (
            (_dt(m, (E,), R, torch.int64), 0, _dt(m, (T * K,), S0, torch.int64), _dt(m, (T * K,), S0, torch.int64)), {}))
        c(aten.scatter.src, lambda m, T=T: ((_dt(m, (T, D), S0), 1, _dt(m, (T, K), S0, torch.int64), _dt(m, (T, K), S0)), {}))
        c(aten.scatter.value, lambda m, T=T: ((_dt(m, (T, E), S0), 1, _dt(m, (T, K), S0, torch.int64), 0.0), {}))
        c(aten.scatter_reduce.two, lambda m, T=T: (
            (_dt(m, (T, D), R, torch.float32), 0, _dt(m, (T * K, D), S0, torch.int64), _dt(m, (T * K, D), S0, torch.float32),
             "sum"), {}))
        c(aten.histc.default, lambda m, T=T: ((_dt(m, (T * K,), S0, torch.float32), E, 0, E), {}))
        c(aten.index.Tensor, lambda m, T=T: ((_dt(m, (T, D), R), [_dt(m, (T * K,), S0, torch.int64)]), {}))
        c(aten.index_put.default, lambda m, T=T: (
            (_dt(m, (T, D), R), [_dt(m, (T * K,), S0, torch.int64)], _dt(m, (T * K, D), S0), True), {}))
        c(aten.slice_scatter.default, lambda m, T=T: ((_dt(m, (T + E * 8, D), S1), _dt(m, (T, D), S1), 0, 0, T), {}))
        c(torch.ops.dtensor_rules.moe_permute_indices.default,
          lambda m, T=T: ((_dt(m, (E,), R, torch.int64), E, 1, T * K + E * 8, 8), {}))
        c(aten.detach.default, lambda m, T=T: ((_dt(m, (T, D), S0),), {}))
    T = 4096
    out.append(Case(aten.cat.default, "many", lambda m: (([_dt(m, (T, D), S0) for _ in range(8)], 0), {})))
    # token shards joined along the sharded dim (they must move): the dispatch search's worst case
    for n in (6, 12):
        out.append(Case(aten.cat.default, "many-moves", lambda m, n=n: (([_dt(m, (T, D), S0) for _ in range(n)], 0), {})))
    out.append(Case(aten.cat.default, "many", lambda m: (([_dt(m, (T, D), S0) for _ in range(12)], 1), {})))
    out.append(Case(aten.cat.default, "many", lambda m: (([_dt(m, (T, D), S0, extra=Partial()) for _ in range(6)], 1), {})))
    out.append(Case(aten.cat.default, "many", lambda m: (([_dt(m, (4, 3), R, torch.float32) for _ in range(6)], 0), {})))
    out.append(Case(aten.cat.default, "many", lambda m: (
        ([_dt(m, (4, 3), Partial() if i % 2 else R, torch.float32) for i in range(6)], 0), {})))
    out.append(Case(aten.cat.default, "uneven", lambda m: (
        ([_dt(m, (T + 3, 7), S0), _dt(m, (T + 3, 5), S0), _dt(m, (T + 3, 1), S0)], 1), {})))
    out.append(Case(aten.slice_scatter.default, "uneven", lambda m: (
        (_dt(m, (T + 1, D + 3), S1), _dt(m, (T + 1, 3), R), 1, 0, 6, 2), {})))
    # inputs that must move: no strategy of either rule takes them as they are
    out.append(Case(torch.ops.prims.fma.default, "moves", lambda m: (
        (_dt(m, (T, D), S0), _dt(m, (T, D), S1), _dt(m, (T, D), Partial())), {})))
    out.append(Case(aten.cumsum.default, "moves", lambda m: ((_dt(m, (T, E), S0, torch.float32), 0), {})))
    out.append(Case(aten.gather.default, "moves", lambda m: ((_dt(m, (T, E), S1), 1, _dt(m, (T, K), S1, torch.int64)), {})))
    out.append(Case(aten.scatter_add.default, "moves", lambda m: (
        (_dt(m, (E, D), S0, torch.float32), 0, _dt(m, (T, D), S1, torch.int64), _dt(m, (T, D), S1, torch.float32)), {})))
    out.append(Case(aten._grouped_mm.default, "2-dim",
                    lambda m: ((_dt(m, (T, D), S0, extra=Shard(1)), _dt(m, (E, D, H), extra=Shard(1)),
                                _dt(m, (E,), None, torch.int32)), {})))
    return out


def _clear_all() -> None:
    """DTensor's sharding caches and our rules' row memos (cat / slice_scatter): nothing warm."""
    clear_sharding_caches()
    clear_row_caches()


class Side(NamedTuple):
    """One side's result for one case: best time, strategies chosen from, or why it failed."""

    ms: float | None
    strategies: int | None
    error: str


def _install(ours: bool) -> None:
    (dtensor_rules.install if ours else dtensor_rules.uninstall)()


def time_pair(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any], repeats: int, budget_s: float) -> dict[bool, Side]:
    """Cold propagations (caches cleared each time), ours and upstream's ALTERNATING call by call so
    load spikes on the shared machine hit both sides alike; per side the MIN over the repeats (the
    least disturbed estimate of the cost) and the strategies the min-cost selection chose from."""
    info = unwrap_to_op_info(op, args, kwargs)
    sides: dict[bool, Side] = {}
    for ours in (True, False):  # untimed first call per side: first-use costs are not the rule's
        _install(ours)
        try:
            _clear_all()
            propagate(info)
            sides[ours] = Side(None, None, "")
        except Exception as err:  # a side without a rule (or one that fails) is reported, not fatal
            sides[ours] = Side(None, None, f"{type(err).__name__}: {str(err).splitlines()[0][:80]}")
    times: dict[bool, list[float]] = {True: [], False: []}
    counts: dict[bool, int | None] = {True: None, False: None}
    live = [o for o in (True, False) if not sides[o].error]
    for _ in range(repeats):
        for ours in live:
            _install(ours)  # (re)installing resets process caches a real step keeps warm: one untimed call
            _clear_all()
            propagate(info)
            _clear_all()
            with recording_strategy_counts() as n:
                t0 = time.perf_counter()
                propagate(info)
                times[ours].append(time.perf_counter() - t0)
            counts[ours] = n[-1] if n else 0
        if sum(map(sum, times.values())) > budget_s:
            break
    dtensor_rules.install()
    return {o: Side(min(times[o]) * 1e3, counts[o], "") if o in live else sides[o] for o in (True, False)}


def run(meshes: Sequence[tuple[int, ...]], repeats: int, budget_s: float, only: Sequence[str] | None) -> list[Row]:
    ensure_prims_fma()
    rows = []
    for shape in meshes:
        with fake_world(math.prod(shape)):
            mesh = init_device_mesh("cpu", shape)
            for case in cases():
                name = str(case.op)
                if only and not any(o in name for o in only):
                    continue
                args, kwargs = case.build(mesh)
                pair = time_pair(case.op, args, kwargs, repeats, budget_s)
                ours, up = pair[True], pair[False]
                note = "; ".join(f"{side}: {s.error}" for side, s in (("ours", ours), ("upstream", up)) if s.error)
                rows.append(Row(name, case.label, "x".join(map(str, shape)), ours.ms, up.ms, ours.strategies, up.strategies, note))
                print(f"  {name} {case.label} {rows[-1].mesh}: {_fmt(rows[-1])}", file=sys.stderr)
    return rows


def _fmt(r: Row) -> str:
    if r.ours_ms is None or r.upstream_ms is None:
        return r.note
    return f"{r.ours_ms:.2f} ms vs {r.upstream_ms:.2f} ms ({r.ours_ms / r.upstream_ms:.2f}x)"


def summary(rows: Sequence[Row]) -> dict[str, Any]:
    """Per mesh: median and max ours/upstream ratio; per case: growth from the smallest to the largest mesh."""
    out: dict[str, Any] = {"per_mesh": {}, "growth": []}
    for mesh in dict.fromkeys(r.mesh for r in rows):
        ratios = [r.ours_ms / r.upstream_ms for r in rows if r.mesh == mesh and r.ours_ms and r.upstream_ms]
        if ratios:
            worst = max((r for r in rows if r.mesh == mesh and r.ours_ms and r.upstream_ms),
                        key=lambda r: r.ours_ms / r.upstream_ms)
            out["per_mesh"][mesh] = {"median": statistics.median(ratios), "max": max(ratios),
                                     "worst": f"{worst.op} ({worst.label})", "n": len(ratios)}
    meshes = list(dict.fromkeys(r.mesh for r in rows))
    if len(meshes) >= 2:
        small, big = meshes[0], max(meshes, key=lambda m: math.prod(map(int, m.split("x"))))
        for key in dict.fromkeys((r.op, r.label) for r in rows):
            a = next((r for r in rows if (r.op, r.label) == key and r.mesh == small), None)
            b = next((r for r in rows if (r.op, r.label) == key and r.mesh == big), None)
            if a and b and a.ours_ms and b.ours_ms and a.upstream_ms and b.upstream_ms:
                out["growth"].append({"op": key[0], "label": key[1], "from": small, "to": big,
                                      "ours": b.ours_ms / a.ours_ms, "upstream": b.upstream_ms / a.upstream_ms})
    return out


def render(rows: Sequence[Row], summ: dict[str, Any]) -> str:
    lines = ["| op | case | mesh | ours ms | upstream ms | ours/upstream | strategies ours/upstream |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.ours_ms is None or r.upstream_ms is None:
            lines.append(f"| {r.op} | {r.label} | {r.mesh} | {_ms(r.ours_ms)} | {_ms(r.upstream_ms)} | n/a ({r.note}) | "
                         f"{r.ours_strategies}/{r.upstream_strategies} |")
            continue
        lines.append(f"| {r.op} | {r.label} | {r.mesh} | {r.ours_ms:.2f} | {r.upstream_ms:.2f} | "
                     f"{r.ours_ms / r.upstream_ms:.2f}x | {r.ours_strategies}/{r.upstream_strategies} |")
    over = [r for r in rows if r.ours_ms and r.upstream_ms and r.ours_ms > SLOW_RATIO * r.upstream_ms]
    lines += ["", f"Cases over {SLOW_RATIO}x upstream: " + (", ".join(
        f"{r.op} ({r.label}, {r.mesh}) {r.ours_ms / r.upstream_ms:.2f}x" for r in over) or "none")]
    lines += ["", "| mesh | median ratio | max ratio | worst case | cases |", "|---|---|---|---|---|"]
    for mesh, s in summ["per_mesh"].items():
        lines.append(f"| {mesh} | {s['median']:.2f}x | {s['max']:.2f}x | {s['worst']} | {s['n']} |")
    if summ["growth"]:
        g = summ["growth"]
        faster = [x for x in g if x["ours"] > 1.5 * x["upstream"] and x["ours"] > 2]
        lines += ["", f"Growth {g[0]['from']} -> {g[0]['to']} ranks (time ratio, ours vs upstream): "
                  f"median ours {statistics.median(x['ours'] for x in g):.2f}x, upstream "
                  f"{statistics.median(x['upstream'] for x in g):.2f}x; cases where ours grows faster: "
                  + (", ".join(f"{x['op']} ({x['label']}) {x['ours']:.1f}x vs {x['upstream']:.1f}x" for x in faster) or "none")]
    return "\n".join(lines)


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="meshes (8,) and (8,8,8) only, five repeats")
    ap.add_argument("--repeats", type=int, default=15, help="cold propagations per case and side, alternating (min reported)")
    ap.add_argument("--op", action="append", help="only ops whose name contains this (repeatable)")
    ap.add_argument("--mesh", action="append", help="a mesh shape like 2x2x2 (repeatable; default: the four meshes)")
    ap.add_argument("--json", action="store_true", help="print one JSON document")
    args = ap.parse_args(argv)
    meshes = ((8,), (8, 8, 8)) if args.quick else MESHES
    if args.mesh:
        meshes = tuple(tuple(int(n) for n in m.split("x")) for m in args.mesh)
    repeats = 5 if args.quick else args.repeats
    rows = run(meshes, repeats, budget_s=2.0, only=args.op)
    summ = summary(rows)
    if args.json:
        print(json.dumps({"torch": torch.__version__, "rows": [r._asdict() for r in rows], "summary": summ}, indent=1))
    else:
        print(f"torch {torch.__version__}; cold propagation, caches cleared before each call; min of {repeats} alternating calls per side\n")
        print(render(rows, summ))
    return 0


if __name__ == "__main__":
    sys.exit(main())

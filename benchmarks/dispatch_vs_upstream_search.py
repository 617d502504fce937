"""Dispatch's strategy search vs upstream's own search, on the same single-dim rule rows.

Upstream torch (2.13 and 2.14) ships ``_dijkstra_expand_single_dim_strategy_to_mesh``: a
priority-queue search over the inputs' placements for the cheapest full-mesh strategy of a
single-dim rule (not yet called by its propagator). Where it declines (a list of tensors such as
``cat``'s or ``index_put``'s indices, a tensor keyword, ``_StridedShard``, symbolic sizes) its
caller falls back to the full expansion of every row product; "upstream" below is that pair,
run on OUR rule's rows (the registry's checked rows; ``cat_rows`` / ``slice_scatter_rows`` for
the two ``op_strategy`` rules), so only the search differs.

Per case (the ops and MoE shapes of ``benchmarks/propagation_cost.py``, plus ``cat`` of 12
inputs and two single-input calls that must move) on fake 2x2x2 and 8x8x8 meshes:

- **time**: one cold propagation (DTensor's and our row caches cleared), the op's strategy
  function swapped between ours and upstream's search; ours and upstream's alternate call by
  call, min of the repeats (fewer once a side has spent ``budget_s``; one upstream call is
  stopped after ``SEARCH_CAP_S``, and a full expansion above ``FULL_EXPANSION_LIMIT`` is not
  run: such cases are printed below the table with ours' numbers); and the search alone (the
  strategy function called on the same schema), which is the part that differs;
- **choice**: the strategy DTensor's min-cost selection takes from each side's answer, priced the
  same way for both: DTensor's ``redistribute_cost`` summed over inputs (what dispatch compares),
  and the bytes one rank sends along DTensor's redistribute plan (ring volumes: all-gather and
  reduce-scatter (n-1)/n of the logical tensor on that mesh dim, all-reduce twice that,
  all-to-all (n-1)/n of the local piece).

    python benchmarks/dispatch_vs_upstream_search.py            # 2x2x2 and 8x8x8, min of 7
    python benchmarks/dispatch_vs_upstream_search.py --quick    # 2x2x2 only, min of 3
    python benchmarks/dispatch_vs_upstream_search.py --json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Partial, Replicate, Shard

sys.path.insert(0, str(Path(__file__).resolve().parent))
from propagation_cost import E, K, _dt, cases as propagation_cases  # noqa: E402  (the same ops and shapes)

import dtensor_rules  # noqa: E402
from dtensor_rules._upstream import (  # noqa: E402
    DTensorSpec,
    OpSchema,
    OpStrategy,
    SingleDimStrategyInfo,
    TupleStrategy,
    clear_sharding_caches,
    dijkstra_single_dim_rule,
    ensure_prims_fma,
    expand_single_dim_rule,
    output_tensor_meta,
    propagate,
    redistribute_cost,
    registry,
    select_min_cost_strategy,
    unwrap_to_op_info,
)
from dtensor_rules._upstream.planner import plan_uncached  # noqa: E402
from dtensor_rules.dispatch.greedy import flat_inputs  # noqa: E402
from dtensor_rules.dispatch.single_dim import SingleDimStrategy  # noqa: E402
from dtensor_rules.op_rules.slicing import _cat_call, cat_rows, clear_row_caches, slice_scatter_rows, _scatter_call  # noqa: E402

aten = torch.ops.aten
MESHES: tuple[tuple[int, ...], ...] = ((2, 2, 2), (8, 8, 8))
# upstream's fallback expansion of more (products x inputs) than this is not run: cat of 12 inputs
# would take minutes a call (each product prices every input)
FULL_EXPANSION_LIMIT = 600_000
# one call of upstream's search is stopped after this long: with rows that list many Partial
# placements, every Replicate -> Partial / Shard step is free, and the search walks the whole
# zero-cost plateau of states before it reaches a costed one (minutes for prims.fma on 2x2x2)
SEARCH_CAP_S = 30.0
OPS = ("cat", "index_put", "cumsum", "slice_scatter", "_grouped_mm", "gather", "scatter_add", "sort", "topk",
       "scatter.src", "fma", "_softmax_backward_data")
StrategyFn = Callable[[OpSchema], OpStrategy]
RowsFn = Callable[[OpSchema], list[list[Any]]]


class Case(NamedTuple):
    op: Any
    label: str
    build: Callable[[Any], tuple[tuple[Any, ...], dict[str, Any]]]


def cases() -> list[Case]:
    """propagation_cost's cases of the ops above, and cat of 12 inputs (sharded; Partial on mesh dim 1)."""
    out = [Case(c.op, c.label, c.build) for c in propagation_cases()
           if any(str(c.op).split(".")[-2] == name or str(c.op).endswith(name) for name in OPS)]
    T, D = 4096, 512
    out.append(Case(aten.cat.default, "many-12", lambda m: (([_dt(m, (T, D), Shard(0)) for _ in range(12)], 0), {})))
    out.append(Case(aten.cat.default, "many-12", lambda m: (
        ([_dt(m, (T, D), Shard(0), extra=Partial()) for _ in range(12)], 1), {})))
    out.append(Case(aten.cat.default, "moves-6", lambda m: (
        ([_dt(m, (T, D), Shard(i % 2)) for i in range(6)], 0), {})))
    # one input that must move: the states upstream's search walks are few
    out.append(Case(aten.cumsum.default, "moves-2dim", lambda m: (
        (_dt(m, (T, E), Shard(0), torch.float32, extra=Shard(0)), 0), {})))
    out.append(Case(aten.topk.default, "moves", lambda m: ((_dt(m, (T, E), Shard(0), extra=Shard(1)), K, -1), {})))
    return out


def rules_rows(op: Any, ours: Any) -> tuple[RowsFn, bool] | None:
    """The rows our installed rule serves (and whether it allows uneven shards), or None."""
    if isinstance(ours, SingleDimStrategy):
        return (lambda s: ours.rows(s.op, s.args_meta, s.kwargs_meta)), ours.allow_uneven_sharding
    if op is aten.cat.default:
        def cat(s: OpSchema) -> list[list[Any]]:
            args = s.args_meta
            call = _cat_call(list(args[0]), args[1] if len(args) > 1 else s.kwargs_meta.get("dim", 0), False)
            return [] if call is None else list(cat_rows(call))
        return cat, True
    if op is aten.slice_scatter.default:
        return (lambda s: list(slice_scatter_rows(_scatter_call(s)))), True
    return None


class UpstreamSearch:
    """Upstream's search on our rows: Dijkstra, else the full expansion its caller falls back to."""

    def __init__(self, rows: RowsFn, allow_uneven_sharding: bool) -> None:
        self.rows, self.allow_uneven_sharding = rows, allow_uneven_sharding
        self.declined = False  # the last call fell back to the full expansion
        # the search needs the output metadata, which DTensor's propagator computes before it asks
        # a single-dim rule; an op_strategy function is not given it, so it is computed once per case
        self.output_meta: Any = None

    def info(self, op_schema: OpSchema) -> Any:
        return SingleDimStrategyInfo(func=lambda op, a, k: self.rows(op_schema), allow_uneven_sharding=self.allow_uneven_sharding,
                                     allow_unbacked_sharding=False)

    def __call__(self, op_schema: OpSchema) -> OpStrategy:
        mesh = flat_inputs(op_schema)[0].strategies[0].output_spec.mesh
        info = self.info(op_schema)
        found = dijkstra_single_dim_rule(mesh, op_schema, info, self.output_meta)
        self.declined = found is None
        if found is not None:
            return found
        return expand_single_dim_rule(mesh, op_schema, info, None)(op_schema.op, op_schema.args_meta, op_schema.kwargs_meta)


def declines(op_schema: OpSchema) -> bool:
    """Whether upstream's search returns None at once (its own test: a list of tensors or a tensor keyword)."""
    return any(isinstance(a, TupleStrategy) for a in op_schema.args_schema) or any(
        isinstance(v, (OpStrategy, TupleStrategy)) for v in op_schema.kwargs_schema.values())


class Choice(NamedTuple):
    cost: float  # DTensor's redistribute_cost, summed over inputs
    mib: float  # MiB one rank sends (module doc)
    layouts: str


def step_bytes(info: Any, mesh: Any, itemsize: int) -> float:
    """Bytes one rank sends for one of upstream's single-mesh-dim steps (module doc)."""
    src, dst = info.src_dst_placements
    n = mesh.size(info.mesh_dim)
    logical = math.prod(int(s) for s in info.logical_shape) * itemsize
    if src.is_replicate():
        return 0.0
    if src.is_partial():
        return (2.0 if dst.is_replicate() else 1.0) * (n - 1) / n * logical
    if dst.is_shard():  # all-to-all of the local piece
        return (n - 1) / n * logical / n
    return (n - 1) / n * logical  # all-gather


def price(strategy: OpStrategy, op_schema: OpSchema) -> Choice:
    """What dispatch takes from ``strategy`` (min-cost selection), priced one way for both sides."""
    picked = select_min_cost_strategy(strategy, op_schema)
    currents = [s.strategies[0].output_spec for s in flat_inputs(op_schema)]
    cost = moved = 0.0
    for cur, dst in zip(currents, picked.input_specs):
        target = DTensorSpec(cur.mesh, tuple(dst.placements), tensor_meta=cur.tensor_meta)
        if tuple(cur.placements) == target.placements:
            continue
        cost += redistribute_cost(cur, target)
        try:
            moved += sum(step_bytes(i, cur.mesh, cur.tensor_meta.dtype.itemsize) for i in plan_uncached(cur, target))
        except Exception:  # a move upstream's planner does not run
            moved = math.inf
    layouts = " ".join("".join(_short(p) for p in s.placements) for s in picked.input_specs)
    return Choice(cost, moved / 2**20, layouts)


def _short(p: Any) -> str:
    if isinstance(p, Replicate):
        return "R"
    if isinstance(p, Shard):
        return f"S{p.dim}"
    if isinstance(p, Partial):
        return "P" if p.reduce_op == "sum" else f"P{p.reduce_op[:2]}"
    return "?"


class Row(NamedTuple):
    op: str
    label: str
    mesh: str
    ours_ms: float
    upstream_ms: float
    ours_search_ms: float
    upstream_search_ms: float
    ours: Choice
    upstream: Choice
    upstream_path: str  # "dijkstra" or "full expansion" (Dijkstra declined)
    ours_samples: int  # timed calls per side (fewer than asked where one call is slow)
    upstream_samples: int


class Stopped(Exception):
    """One call ran past :data:`SEARCH_CAP_S`."""


@contextlib.contextmanager
def capped(seconds: float) -> Any:
    """Raise :class:`Stopped` inside the block once it has run ``seconds`` (the main thread's timer)."""
    def stop(signum: int, frame: Any) -> None:
        raise Stopped

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _clear() -> None:
    clear_sharding_caches()
    clear_row_caches()


def measure(case: Case, mesh: Any, repeats: int, budget_s: float) -> Row | str:
    args, kwargs = case.build(mesh)
    info = unwrap_to_op_info(case.op, args, kwargs)
    funcs = registry("op_strategy_funcs")
    ours = funcs.get(case.op)
    got = rules_rows(case.op, ours)
    if got is None:
        return f"{case.op}: not served by a row rule of ours"
    upstream = UpstreamSearch(*got)
    seen: list[OpSchema] = []

    def recording(s: OpSchema) -> OpStrategy:
        seen.append(s)
        return ours(s)

    sides: dict[str, StrategyFn] = {"ours": ours, "upstream": upstream}
    prop: dict[str, list[float]] = {"ours": [], "upstream": []}
    search: dict[str, list[float]] = {"ours": [], "upstream": []}
    try:
        funcs[case.op] = recording
        _clear()
        propagate(info)  # the strategy schema DTensor builds, and first-use costs out of the timing
        schema = seen[-1]
        upstream.output_meta = output_tensor_meta(info.schema)
        n_in = len(flat_inputs(schema))
        products = (len(got[0](schema)) + 1) ** mesh.ndim
        too_large = declines(schema) and products * n_in > FULL_EXPANSION_LIMIT
        stopped = False
        for _ in range(repeats):
            for name, fn in sides.items():  # alternating: machine load hits both sides alike
                if sum(prop[name]) + sum(search[name]) > budget_s or (name == "upstream" and (stopped or too_large)):
                    continue  # a slow side keeps the samples it has (at least one)
                funcs[case.op] = fn
                try:
                    with capped(SEARCH_CAP_S):
                        _clear()
                        t0 = time.perf_counter()
                        propagate(info)
                        prop[name].append(time.perf_counter() - t0)
                        _clear()
                        t0 = time.perf_counter()
                        fn(schema)
                        search[name].append(time.perf_counter() - t0)
                except Stopped:
                    if name == "ours":
                        raise
                    stopped = True
        _clear()
        choices = {"ours": price(ours(schema), schema)}
        if not stopped and not too_large:
            choices["upstream"] = price(upstream(schema), schema)
    finally:
        funcs[case.op] = ours
        _clear()
    ours_note = (f"ours: propagation {min(prop['ours']) * 1e3:.2f} ms, search {min(search['ours']) * 1e3:.2f} ms, "
                 f"cost {choices['ours'].cost:.1f}, {choices['ours'].mib:.2f} MiB/rank")
    if too_large:
        return (f"{case.op} {case.label} {'x'.join(map(str, mesh.shape))}: upstream's search declines (a list input or "
                f"a tensor keyword); its caller's full expansion ({products} products x {n_in} inputs) not run ({ours_note})")
    if stopped:
        return (f"{case.op} {case.label} {'x'.join(map(str, mesh.shape))}: upstream's search stopped after {SEARCH_CAP_S:.0f} s "
                f"({ours_note})")
    return Row(str(case.op), case.label, "x".join(map(str, mesh.shape)), min(prop["ours"]) * 1e3,
               min(prop["upstream"]) * 1e3, min(search["ours"]) * 1e3, min(search["upstream"]) * 1e3,
               choices["ours"], choices["upstream"], "full expansion" if upstream.declined else "dijkstra",
               len(search["ours"]), len(search["upstream"]))


def run(meshes: Sequence[tuple[int, ...]], repeats: int, only: str | None, budget_s: float = 3.0,
        label: str | None = None) -> tuple[list[Row], list[str]]:
    from dtensor_rules.testing import fake_world

    ensure_prims_fma()
    dtensor_rules.install()
    rows, notes = [], []
    for shape in meshes:
        with fake_world(math.prod(shape)):
            mesh = init_device_mesh("cpu", shape)
            for case in cases():
                if (only and only not in str(case.op)) or (label and label != case.label):
                    continue
                got = measure(case, mesh, repeats, budget_s)
                if isinstance(got, str):
                    notes.append(got)
                    continue
                rows.append(got)
                print(f"  {got.op} {got.label} {got.mesh}: search {got.ours_search_ms:.2f} vs {got.upstream_search_ms:.2f} ms, "
                      f"cost {got.ours.cost:.1f} vs {got.upstream.cost:.1f} ({got.upstream_path})", file=sys.stderr)
    return rows, list(dict.fromkeys(notes))


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


def _cmp(a: float, b: float) -> str:
    if math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9):
        return "="
    return "ours less" if a < b else "upstream less"


def _samples(r: Row) -> str:
    return "" if r.upstream_samples == r.ours_samples else f" (min of {r.upstream_samples})"


def render(rows: Sequence[Row]) -> str:
    lines = ["| op | case | mesh | propagation ms ours / upstream | ratio | search ms ours / upstream | ratio | "
             "cost ours / upstream | MiB/rank ours / upstream | choice | upstream path |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r.op} | {r.label} | {r.mesh} | {r.ours_ms:.2f} / {r.upstream_ms:.2f} | {_ratio(r.ours_ms, r.upstream_ms)} | "
            f"{r.ours_search_ms:.2f} / {r.upstream_search_ms:.2f} | {_ratio(r.ours_search_ms, r.upstream_search_ms)} | "
            f"{r.ours.cost:.1f} / {r.upstream.cost:.1f} | {r.ours.mib:.2f} / {r.upstream.mib:.2f} | "
            f"{_cmp(r.ours.cost, r.upstream.cost)} | {r.upstream_path}{_samples(r)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="the 2x2x2 mesh only, min of 3")
    ap.add_argument("--repeats", type=int, default=7, help="cold calls per case and side, alternating (min reported)")
    ap.add_argument("--op", help="only ops whose name contains this")
    ap.add_argument("--label", help="only cases of this label (even, uneven, many, moves, many-12, ...)")
    ap.add_argument("--json", action="store_true", help="print one JSON document")
    a = ap.parse_args(argv)
    meshes = MESHES[:1] if a.quick else MESHES
    rows, notes = run(meshes, 3 if a.quick else a.repeats, a.op, label=a.label)
    if a.json:
        rows_json = [{**r._asdict(), "ours": r.ours._asdict(), "upstream": r.upstream._asdict()} for r in rows]
        print(json.dumps({"torch": torch.__version__, "rows": rows_json, "notes": notes}, indent=1))
    else:
        print(f"torch {torch.__version__}; cold, caches cleared before each call; min of {3 if a.quick else a.repeats} "
              "alternating calls per side\n")
        print(render(rows))
        for n in notes:
            print(f"\n{n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m dtensor_rules demo``: the MoE block on a simulated 2-D mesh, end to end.

Six sections, each a claim the package makes, checked live (nothing is precomputed):

1. the DeepSeekV3-style MoE block and how ``shard_moe`` places its parameters;
2. op coverage: every op of its forward+backward has a DTensor sharding rule (ours or upstream);
3. sharded = single-device: forward and backward on the simulated mesh (every rank runs
   in this process on real data, ``dtensor_rules.testing.simulated_mesh``) match one device,
   output and ALL gradients, in float32 and bfloat16; the sharded model uses the
   ``moe_permute_indices`` custom op (``permute_impl="kernel"``), the reference plain torch;
4. a redistribute plan to a non-default device order (``Plan.explain()``), next to the plan
   to the default order, executed on the simulated mesh and checked;
5. per-op costs of forward+backward: FlopCounterMode with torch 2.13's formulas only vs with
   ours registered, bytes and an H100 roofline estimate from ``dtensor_rules.costs``;
6. expert parallelism (``expert_parallel``, ``src/dtensor_rules/cli/demo_ep.py``): where each parameter
   and its gradient live, the collectives one step runs (all-to-all, no all_gather) next to
   the ``shard_moe`` gather path's, and the result equal to one device.

Exit status 0 when every check holds, 1 otherwise. It stays fast (seconds, not minutes):
the full rule validator is ``python -m dtensor_rules validate`` / ``benchmarks/rule_coverage.py``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import sys
import time
import warnings
from collections.abc import Iterator
from typing import TextIO

import torch

from dtensor_rules.cli.demo_ep import section_expert_parallel
from dtensor_rules.cli.demo_model import DEMO_CONFIG, TOKENS, TOL, demo_inputs, demo_model, within_tolerance
from dtensor_rules.cli.ui import Steps, header, table
from dtensor_rules.models.moe import MoE, shard_moe

__all__ = ["run_demo", "demo_model", "demo_inputs", "within_tolerance", "DEMO_CONFIG", "TOKENS", "single_device",
           "sharded_run", "compare", "flop_rows"]


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence torch's log/warning chatter (fake-tensor fallbacks, 'suboptimal redistribute' notes)."""
    loggers = [logging.getLogger(n) for n in ("torch", "torch.distributed", "torch._subclasses.fake_tensor")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, lvl in zip(loggers, levels):
            lg.setLevel(lvl)


# --------------------------------------------------------------------------- 1. the block
def section_model(mesh_shape: tuple[int, ...], out: TextIO) -> None:
    c = DEMO_CONFIG
    header("1. the MoE block (DeepSeekV3-style) and its sharding", out)
    T = math.prod(TOKENS[:-1])
    print(
        f"dim {c.dim}, hidden {c.hidden}, {c.n_experts} routed experts (top-{c.top_k}), "
        f"{c.n_shared} shared; {T} tokens; mesh {'x'.join(map(str, mesh_shape))} = ('ep', 'tp'), simulated",
        file=out,
    )
    model = demo_model(torch.float32)
    plan = {
        "w1": ("Shard(0)", "Shard(2)", "experts over ep, hidden column-parallel"),
        "w3": ("Shard(0)", "Shard(2)", "as w1"),
        "w2": ("Shard(0)", "Shard(1)", "hidden row-parallel: output Partial over tp"),
        "gate": ("Replicate", "Replicate", "every rank routes its own tokens"),
        "shared_w1": ("Replicate", "Shard(0)", "colwise Linear"),
        "shared_w3": ("Replicate", "Shard(0)", "colwise Linear"),
        "shared_w2": ("Replicate", "Shard(1)", "rowwise Linear: output Partial over tp"),
        "tokens x": ("Shard(0)", "Replicate", "data parallel over ep"),
    }
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()} | {"tokens x": TOKENS}
    rows = [(n, "x".join(map(str, shapes[n])), ep, tp, why) for n, (ep, tp, why) in plan.items()]
    print(table(rows, ("tensor", "shape", "ep", "tp", "why")), file=out)


# --------------------------------------------------------------------------- 2. coverage
def section_coverage(mesh_shape: tuple[int, ...], out: TextIO) -> bool:
    from dtensor_rules.cli.coverage import coverage, describe_moe_example, moe_example

    header("2. op coverage of forward+backward: where each op's sharding rule comes from", out)
    with Steps("coverage", 2, out) as s:
        s.step("trace forward+backward (make_fx) and ask each op's rule")
        # the model `python -m dtensor_rules coverage` traces too (bf16: _grouped_mm's CPU meta kernel needs it)
        report = coverage(*moe_example(), mesh_shape=mesh_shape)
        s.step("render")
    print(describe_moe_example() + " (the same as `python -m dtensor_rules coverage`)", file=out)
    rows = [(r.name, r.calls, r.rule, r.strategies) for r in report.rows]
    print(table(rows, ("op", "calls", "rule", "strategies on mesh"), right=(1, 3)), file=out)
    counts = {k: sum(r.rule == k for r in report.rows) for k in ("ours", "upstream", "decomp", "handler", "none")}
    print(f"{len(report.rows)} ops: " + ", ".join(f"{v} {k}" for k, v in counts.items()), file=out)
    errors = [r for r in report.rows if r.strategies == "err"]
    for r in errors:
        print(f"  {r.name}: strategy query failed: {r.error}", file=out)
    ok = not report.missing and not errors
    print("every op has a rule: " + ("yes" if ok else f"NO, missing {', '.join(map(str, report.missing))}"), file=out)
    return ok


# --------------------------------------------------------------------------- 3. sharded = single
def _copies(t: torch.Tensor) -> list[torch.Tensor]:
    """A simulated (LocalTensor) full tensor holds one copy per rank; a plain tensor is one copy."""
    from dtensor_rules.testing import local_shards

    return local_shards(t)


def single_device(dtype: torch.dtype) -> tuple[MoE, torch.Tensor, torch.Tensor, list[str], list[torch.Tensor]]:
    """Model (kernel permute, not yet sharded), tokens, cotangent, names and single-device results.

    Call it OUTSIDE the simulated mesh: under LocalTensorMode even seeded RNG and plain
    tensor math run once per rank.
    """
    x, cot = demo_inputs(dtype)
    reference = demo_model(dtype, permute_impl="torch")
    xr = x.clone().requires_grad_()
    out = reference(xr)
    want = [out.detach(), *torch.autograd.grad(out, [xr, *reference.parameters()], cot)]
    names = ["output", "grad x", *[f"grad {n}" for n, _ in reference.named_parameters()]]
    return demo_model(dtype, permute_impl="kernel"), x, cot, names, want


def sharded_run(model: MoE, x: torch.Tensor, cot: torch.Tensor, mesh, steps: Steps | None = None) -> list[list[torch.Tensor]]:
    """Every rank's copy of the sharded output and gradients (x first, then parameters), as full tensors."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    def step(what: str) -> None:
        if steps is not None:
            steps.step(what)

    step(f"{x.dtype}: distribute parameters and tokens")
    sharded = shard_moe(model, mesh)
    xd = distribute_tensor(x, mesh, (Shard(0), Replicate())).requires_grad_()
    step(f"{x.dtype}: sharded forward")
    outd = sharded(xd)
    step(f"{x.dtype}: sharded backward")
    grads = torch.autograd.grad(outd, [xd, *sharded.parameters()], distribute_tensor(cot, mesh, outd.placements))
    step(f"{x.dtype}: gather full tensors")
    return [_copies(g.full_tensor()) for g in (outd, *grads)]


def compare(names: list[str], got: list[list[torch.Tensor]], want: list[torch.Tensor], dtype: torch.dtype) -> list[tuple[str, float, bool]]:
    """(name, max |sharded - single| over every rank's copy, all copies within tolerance)."""
    return [
        (name, max((c.float() - w.float()).abs().max().item() for c in copies),
         all(within_tolerance(c, w, dtype) for c in copies))
        for name, copies, w in zip(names, got, want)
    ]


def section_sharded(mesh_shape: tuple[int, ...], out: TextIO) -> bool:
    from dtensor_rules.testing import simulated_mesh

    header("3. sharded = single device: forward and backward, every rank checked", out)
    dtypes = (torch.float32, torch.bfloat16)
    with Steps("sharded run", 5 * len(dtypes), out) as s:
        results = []
        for dt in dtypes:
            s.step(f"{dt}: single device forward+backward")
            model, x, cot, names, want = single_device(dt)
            with simulated_mesh(mesh_shape, names=("ep", "tp")) as mesh:
                got = sharded_run(model, x, cot, mesh, s)
            results.append(compare(names, got, want, dt))
    f32, b16 = results
    rows = [
        (name, f"{d32:.1e}", "ok" if ok32 else "FAIL", f"{d16:.1e}", "ok" if ok16 else "FAIL")
        for (name, d32, ok32), (_, d16, ok16) in zip(f32, b16)
    ]
    print(table(rows, ("tensor", "float32 max|diff|", "", "bfloat16 max|diff|", ""), right=(1, 3)), file=out)
    print(f"tolerances: float32 {TOL[torch.float32]}; bfloat16 {TOL[torch.bfloat16]} (2% rel)", file=out)
    print("sharded model: permute_impl='kernel' (custom op moe_permute_indices); reference: 'torch'", file=out)
    ok = all(r[2] for r in f32 + b16)
    print(f"sharded = single device: {'yes' if ok else 'NO'}", file=out)
    return ok


# --------------------------------------------------------------------------- 4. planner
def section_plan(mesh_shape: tuple[int, ...], out: TextIO) -> bool:
    from torch.distributed.tensor import Partial, Shard

    from dtensor_rules.redistribute import distribute_tensor, plan, redistribute
    from dtensor_rules.testing import local_shards, simulated_mesh

    header("4. redistribute to a non-default device order (dtensor_rules.plan)", out)
    src, dst = (Partial(), Shard(0)), (Shard(0), Shard(0))
    shape, dtype = (4096, 7168), torch.bfloat16
    print(
        "routed-expert output, Partial over ep and token-sharded over tp, to token-sharded over both.\n"
        "device_order=(1, 0): tp splits the tokens first, ep second -- the layout the data already has:",
        file=out,
    )
    ordered = plan(mesh_shape, shape, dtype, src, dst, dst_device_order=(1, 0))
    print(ordered.explain(), file=out)
    default = plan(mesh_shape, shape, dtype, src, dst)
    print("\nthe same move to DTensor's default order (0, 1):", file=out)
    print(default.explain(), file=out)
    print(f"\nthe device order saves {default.cost_us / ordered.cost_us:.1f}x ({len(ordered.steps)} vs {len(default.steps)} collectives)", file=out)

    # execute it on the simulated mesh with an uneven tensor and check every rank's rows
    full = torch.arange(10 * 3, dtype=torch.float32).reshape(10, 3)
    with simulated_mesh(mesh_shape, names=("ep", "tp")) as mesh:
        x = distribute_tensor(full, mesh, src)
        y = redistribute(x, dst, device_order=(1, 0))
        same = all(torch.equal(c, full) for c in _copies(y.full_tensor()))
        shards = local_shards(y)  # public helper: every simulated rank's shard, in rank order
        rows = []
        for r in range(len(shards)):
            ep, tp = divmod(r, mesh_shape[1])
            first = shards[r][:, 0].div(3).long().tolist()  # row index = value // 3
            rows.append((f"({ep}, {tp})", ", ".join(map(str, first)) or "-"))
    print(f"\nexecuted on the simulated mesh, tensor 10x3 (uneven): full_tensor() == input: {same}", file=out)
    print(table(rows, ("rank (ep, tp)", "rows held")), file=out)
    return same


# --------------------------------------------------------------------------- 5. costs
def flop_rows(model: torch.nn.Module, x: torch.Tensor, cot: torch.Tensor) -> list[dict]:
    """Per op of forward+backward: calls, torch-only FlopCounterMode flops, with ours, bytes, H100 seconds.

    ``bytes``/``h100_s`` come from ``dtensor_rules.costs.estimate_call`` (memory-bound
    fallback, flagged ``approx``, for ops the cost package has no formula for yet;
    ``inexact``: a formula that assumed data-dependent values, ``~`` as in ``coverage``).
    """
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import FlopCounterMode

    from dtensor_rules.costs import estimate_call, runtime
    from dtensor_rules.costs.flop_counter import torch_flop_formulas_only

    calls: list[tuple] = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            calls.append((func, args, kwargs or {}))
            return func(*args, **(kwargs or {}))

    def run() -> None:
        xr = x.clone().requires_grad_()
        model.zero_grad(set_to_none=True)
        model(xr).backward(cot)  # not autograd.grad: FlopCounterMode's module hooks reject it

    def counted() -> dict:
        with FlopCounterMode(display=False) as fc:
            run()
        return {str(k): v for k, v in fc.get_flop_counts()["Global"].items()}

    with torch_flop_formulas_only():
        torch_only = counted()
    ours = counted()
    with Record():
        run()

    rows: dict[str, dict] = {}
    for func, args, kwargs in calls:
        row = rows.setdefault(str(func), {"op": str(func), "calls": 0, "bytes": 0, "h100_s": 0.0, "approx": False,
                                          "inexact": False})
        row["calls"] += 1
        cost = estimate_call(func, args, kwargs, fallback=True)
        row["bytes"] += cost.bytes_read + cost.bytes_written
        row["h100_s"] += runtime(cost, "h100")
        row["approx"] |= cost.source == "fallback"
        row["inexact"] |= not cost.exact and cost.source != "fallback"
        row["packet"] = str(func.overloadpacket)
    for row in rows.values():
        row["torch_flops"] = torch_only.get(row["packet"], 0)
        row["our_flops"] = ours.get(row["packet"], 0)
    return sorted(rows.values(), key=lambda r: r["op"])


def _si(v: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(v) >= scale:
            return f"{v / scale:.1f}{unit}"
    return f"{v:.0f}"


def section_costs(out: TextIO) -> bool:
    header("5. per-op cost of forward+backward (float32, one device)", out)
    with Steps("costs", 2, out) as s:
        s.step("FlopCounterMode with torch's formulas, then ours; estimate every call")
        model = demo_model(torch.float32, permute_impl="kernel")
        rows = flop_rows(model, *demo_inputs(torch.float32))
        s.step("render")
    body = [
        (r["op"], r["calls"], _si(r["torch_flops"]), _si(r["our_flops"]),
         _si(r["bytes"]) + "B", ("~" if r["inexact"] else "") + f"{r['h100_s'] * 1e6:.1f}" + ("*" if r["approx"] else ""))
        for r in rows
    ]
    tot = [sum(r[k] for r in rows) for k in ("torch_flops", "our_flops", "bytes", "h100_s")]
    body.append(("total", sum(r["calls"] for r in rows), _si(tot[0]), _si(tot[1]), _si(tot[2]) + "B", f"{tot[3] * 1e6:.1f}"))
    head = ("op", "calls", "flops torch 2.13", "flops +dtensor_rules", "bytes r+w", "H100 us")
    print(table(body, head, right=(1, 2, 3, 4, 5)), file=out)
    free = [r["op"] for r in rows if r["torch_flops"] == 0 and r["our_flops"] > 0]
    print(f"FlopCounterMode (torch's convention: floating matmul-like work) counts 0 for {', '.join(free)} "
          "without dtensor_rules; integer routing ops stay 0 there, their cost is in the bytes column", file=out)
    print("H100 us: roofline (dtensor_rules.costs.runtime); ~ = assumed data-dependent values (as in `coverage`), "
          "* = memory-bound fallback, no formula yet", file=out)
    return bool(free)


# --------------------------------------------------------------------------- main
def run_demo(mesh_shape: tuple[int, ...] = (2, 2), out: TextIO | None = None) -> int:
    """Run all sections; 0 if every check held."""
    out = out or sys.stdout
    mesh_shape = tuple(mesh_shape)
    if len(mesh_shape) != 2:
        print(f"error: the demo needs a 2-D ('ep', 'tp') mesh such as 2x2, got {'x'.join(map(str, mesh_shape))}", file=sys.stderr)
        return 2
    if DEMO_CONFIG.n_experts % mesh_shape[0]:
        print(f"error: the 'ep' mesh dim ({mesh_shape[0]}) must divide n_experts={DEMO_CONFIG.n_experts}; try --mesh 2x2", file=sys.stderr)
        return 2
    start = time.perf_counter()
    checks = {}
    with quiet():
        section_model(mesh_shape, out)
        checks["coverage"] = section_coverage(mesh_shape, out)
        checks["sharded = single device"] = section_sharded(mesh_shape, out)
        checks["planner"] = section_plan(mesh_shape, out)
        checks["costs"] = section_costs(out)
        checks["expert parallel"] = section_expert_parallel(mesh_shape, out)
    header("summary", out)
    for name, ok in checks.items():
        print(f"{name:28s} {'ok' if ok else 'FAILED'}", file=out)
    print(f"done in {time.perf_counter() - start:.1f}s", file=out)
    return 0 if all(checks.values()) else 1

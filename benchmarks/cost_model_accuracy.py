"""Predicted vs measured op time: how good is the roofline cost model?

For each op in the issue list over a size sweep, predicts ``runtime(estimate(op, ...), hw)``
and measures the op; prints the ratio predicted/measured per op (median, p10, p90) and overall.

CPU (default): a profile is first calibrated by short microbenchmarks (see
:func:`calibrate`): a per-op floor from a 1-element ``add``, streaming bandwidth from a
large copy, vector rates from cache-resident adds per dtype (``int64`` from a sum: see
:func:`calibrate`), the
matmul rate, and for each op family a small call (its launch floor) and a large call (its
efficiency = model roofline time / measured time). Calibration ops are 1-d calls of
different shapes than the evaluated 2-d cases. The run then reports the ratios for the
calibrated profile and for the shipped static ``cpu`` profile (``hardware.py``).

CPU times are process CPU time with 1 intra-op thread (``--threads 1``, the default): on
a shared box other jobs then do not inflate them (wall time would count the time this
process waits for a core). Each point is the median of ``--reps`` timed batches.
GPU: ``--device cuda --hardware h100`` (or h200/a100/b200) uses the datasheet profile;
``--calibrate`` builds a measured one instead.

    PYTHONPATH=$PWD/src python benchmarks/cost_model_accuracy.py            # ~1-2 minutes on 2 cores
    PYTHONPATH=$PWD/src python benchmarks/cost_model_accuracy.py --print-profile   # the profile as Python
    PYTHONPATH=$PWD/src python benchmarks/cost_model_accuracy.py --device cuda --hardware h100
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import torch

import dtensor_rules  # noqa: F401
from dtensor_rules.op_rules.fma import fma as fma_op  # noqa: E402  (defines prims.fma: inductor is imported lazily)
from dtensor_rules.costs import Hardware, estimate, get_hardware, runtime

aten = torch.ops.aten
Case = tuple[str, Any, tuple, dict]
_CLOCK: Callable[[], float] = time.perf_counter


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure(fn: Callable[[], Any], device: str, min_s: float = 0.004, reps: int = 5) -> float:
    """Median seconds per call over ``reps`` batches of at least ``min_s`` each (after a warm-up)."""
    fn()
    _sync(device)
    one = float("inf")
    for _ in range(3):
        t0 = _CLOCK()
        fn()
        _sync(device)
        one = min(one, _CLOCK() - t0)
    loops = max(1, int(min_s / max(one, 1e-7)))
    times = []
    for _ in range(reps):
        _sync(device)
        t0 = _CLOCK()
        for _ in range(loops):
            fn()
        _sync(device)
        times.append((_CLOCK() - t0) / loops)
    return statistics.median(times)


def _call(case: Case) -> Callable[[], Any]:
    _, op, a, kw = case
    return lambda: op(*a, **kw)


# --------------------------------------------------------------------------- calibration
def _family_cases(device: str) -> dict[str, tuple[Case, Case]]:
    """Per family (or ``family:dtype class``): (tiny call -> launch floor, mid-size 1-d call -> efficiency).

    Mid-size = 2**18 elements (1 MB of fp32): the middle of the evaluated range, held in
    L2/L3, where random-access rates are stable on a shared box.
    """
    g = torch.Generator().manual_seed(1)
    n = 1 << 18

    def rnd(m: int) -> torch.Tensor:
        return torch.randn(m, generator=g).to(device)

    def ri(hi: int, m: int) -> torch.Tensor:
        return torch.randint(0, hi, (m,), generator=g).to(device)

    s, sb, si, bi = rnd(16), rnd(n), ri(16, 16), ri(n, n)
    table, rows = rnd(n).view(-1, 64), ri(n // 64, n // 128)  # 4096 rows of 64 floats, 2048 random rows
    ints = ri(1 << 30, n)
    return {
        "pointwise": (("add", aten.add.Tensor, (s, s), {}), ("add", aten.add.Tensor, (sb, sb), {})),
        "reduction": (("sum", aten.sum.default, (s,), {}), ("sum", aten.sum.default, (sb,), {})),
        "copy": (("clone", aten.clone.default, (s,), {}), ("clone", aten.clone.default, (sb,), {})),
        "gather": (("gather", aten.gather.default, (s, 0, si), {}), ("gather", aten.gather.default, (sb, 0, bi), {})),
        "scatter": (
            ("scatter_add", aten.scatter_add.default, (s, 0, si, s), {}),
            ("scatter_add", aten.scatter_add.default, (sb, 0, bi, rnd(n)), {}),
        ),
        "index": (
            ("index", aten.index.Tensor, (s.view(4, 4), [si[:4] % 4]), {}),
            ("index", aten.index.Tensor, (table, [rows]), {}),
        ),
        "sort": (("sort", aten.sort.default, (s,), {}), ("sort", aten.sort.default, (sb,), {})),
        "scan": (("cumsum", aten.cumsum.default, (s, 0), {}), ("cumsum", aten.cumsum.default, (sb, 0), {})),
        "scan:int64": (("cumsum", aten.cumsum.default, (si, 0), {}), ("cumsum", aten.cumsum.default, (ints, 0), {})),
        "histogram": (
            ("histc", aten.histc.default, (s, 64, -3.0, 3.0), {}),
            ("histc", aten.histc.default, (sb, 64, -3.0, 3.0), {}),
        ),
        "factory": (("new_zeros", aten.new_zeros.default, (s, [16]), {}),) * 2,
        "view": (("view", aten.view.default, (s, [4, 4]), {}),) * 2,
    }


def calibrate(device: str) -> Hardware:
    """A measured profile: floors, bandwidth, vector/matmul rates and per-family efficiencies."""
    one = torch.ones(1, device=device)
    launch = measure(lambda: torch.add(one, one), device)
    n = 1 << 24  # 64 MB per buffer: far out of cache
    src, dst = torch.empty(n, device=device), torch.empty(n, device=device)
    src.fill_(1.0)
    bandwidth = 2 * n * 4 / max(measure(lambda: dst.copy_(src), device, reps=3) - launch, 1e-9)
    del src, dst
    vector = {}
    m = 1 << 14  # 64 KB per fp32 operand: cache resident, so the add is compute/issue bound
    for cls, dtype in (("fp32", torch.float32), ("fp64", torch.float64), ("fp16", torch.bfloat16),
                       ("int32", torch.int32), ("int8", torch.int8)):
        x, y, z = (torch.ones(m, dtype=dtype, device=device) for _ in range(3))
        vector[cls] = m / max(measure(lambda: torch.add(x, y, out=z), device) - launch, 1e-9)
    # int64: a sum (pure adds). torch's int64 ``add`` kernel computes a + alpha * b with a 64-bit
    # multiply (no native vector instruction before AVX-512DQ), so it measures multiply throughput.
    x = torch.ones(m, dtype=torch.int64, device=device)
    vector["int64"] = m / max(measure(lambda: x.sum(), device) - launch, 1e-9)
    tensor = {}
    kk = 256
    for cls, dtype in (("fp32", torch.float32), ("fp16", torch.bfloat16)):
        a, b = torch.randn(kk, kk, device=device, dtype=dtype), torch.randn(kk, kk, device=device, dtype=dtype)
        tensor[cls] = 2 * kk**3 / max(measure(lambda: torch.mm(a, b), device) - launch, 1e-9)
    base = Hardware(
        f"calibrated-{device}", bandwidth, vector, tensor, compute_efficiency=1.0, memory_efficiency=1.0,
        launch_s=launch, source=f"measured by benchmarks/cost_model_accuracy.py ({torch.get_num_threads()} threads)",
    )
    eff: dict[str, float] = {}
    floors: dict[str, float] = {}
    for key, (small, large) in _family_cases(device).items():
        floor = measure(_call(small), device)
        if ":" not in key:
            floors[key] = floor
        if small is large:
            continue
        roof = runtime(estimate(large[1], *large[2], **large[3]), base) - base.launch_s
        eff[key] = roof / max(measure(_call(large), device) - floor, 1e-9)
    return replace(base, family_efficiency=eff, family_launch_s=floors)


def profile_source(hw: Hardware) -> str:
    """The profile as a ``Hardware(...)`` expression (3 significant digits), for hardware.py."""
    def g(v: float) -> str:
        return f"{v:.3g}"

    def table(d: Any) -> str:
        return "{" + ", ".join(f'"{k}": {g(v)}' for k, v in d.items()) + "}"

    return (
        f'Hardware(\n    "cpu", {g(hw.memory_bandwidth)},\n    {table(hw.vector)},\n    {table(hw.tensor)},\n'
        f"    compute_efficiency=1.0, memory_efficiency=1.0, launch_s={g(hw.launch_s)},\n"
        f"    family_efficiency={table(hw.family_efficiency)},\n    family_launch_s={table(hw.family_launch_s)},\n)"
    )


# --------------------------------------------------------------------------- evaluation
def cases(n: int, device: str) -> list[Case]:
    """(name, op, args, kwargs) with about ``n`` elements in the main operand."""
    g = torch.Generator(device="cpu").manual_seed(0)

    def rnd(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    cols = 256
    rows = max(n // cols, 8)
    x = rnd(rows, cols)
    idx = torch.randint(0, rows, (rows // 2, cols), generator=g).to(device)
    rowidx = torch.randint(0, rows, (rows // 2,), generator=g).to(device)
    ints = torch.randint(0, 1000, (rows * cols,), generator=g).to(device)
    K = N = 64
    G = 8
    ends = torch.linspace(0, rows, G + 1)[1:].round().to(torch.int32)
    ends[2] = ends[1]  # one empty group
    a, w = rnd(rows, K), rnd(G, K, N)
    return [
        ("_grouped_mm", aten._grouped_mm.default, (a, w, ends.to(device)), {}),
        ("_softmax_backward_data", aten._softmax_backward_data.default, (x, x, 1, torch.float32), {}),
        ("prims.fma", fma_op, (x, x, x), {}),
        ("gather", aten.gather.default, (x, 0, idx), {}),
        ("scatter_add", aten.scatter_add.default, (x, 0, idx, x), {}),
        ("scatter_reduce.two", aten.scatter_reduce.two, (x, 0, idx, x, "amax"), {}),
        ("index", aten.index.Tensor, (x, [rowidx]), {}),
        ("index(bool)", aten.index.Tensor, (x, [x > 0]), {}),
        ("index_put(acc)", aten.index_put.default, (x, [rowidx], rnd(rows // 2, cols), True), {}),
        ("slice_scatter", aten.slice_scatter.default, (x, x[:, ::2].contiguous(), 1, 0, cols, 2), {}),
        ("cat", aten.cat.default, ([x, x, x],), {}),
        ("sort.stable", aten.sort.stable, (x,), {"stable": True, "dim": 1}),
        ("argsort.stable", aten.argsort.stable, (x,), {"stable": True, "dim": 1}),
        ("topk", aten.topk.default, (x, 8), {}),
        ("cumsum", aten.cumsum.default, (x, 1), {}),
        ("cumsum(int64)", aten.cumsum.default, (ints, 0), {}),
        ("histc", aten.histc.default, (x.flatten(), 100, -3.0, 3.0), {}),
        ("bincount", aten.bincount.default, (ints,), {}),
        ("mm", aten.mm.default, (x, rnd(cols, 64)), {}),
        ("sum(dim)", aten.sum.dim_IntList, (x, [1]), {}),
        ("_to_copy(bf16)", aten._to_copy.default, (x,), {"dtype": torch.bfloat16}),
    ]


def _calibration_packets() -> set[Any]:
    """Op packets a calibration microbenchmark runs (their ratios are not out-of-sample)."""
    packets = {aten.add, aten.mm, aten.copy_}
    for small, large in _family_cases("cpu").values():
        packets |= {small[1].overloadpacket, large[1].overloadpacket}
    return packets


def _line(name: str, rs: list[float], extra: bool = False) -> str:
    p10, med, p90 = np.percentile(rs, [10, 50, 90])
    line = f"{name:26s} {med:8.2f} {p10:8.2f} {p90:8.2f}"
    if extra:
        within2 = np.mean([(0.5 <= r <= 2.0) for r in rs])
        within3 = np.mean([(1 / 3 <= r <= 3.0) for r in rs])
        line += f"   within 2x: {within2:.0%}, within 3x: {within3:.0%} of {len(rs)}"
    return line


def _summary(ratios: dict[str, list[float]], sizes: int, calibrated_on: set[str]) -> str:
    lines = [f"{'op':26s} {'median':>8s} {'p10':>8s} {'p90':>8s}   (predicted / measured, {sizes} sizes; * = "
             "its op also ran in calibration)"]
    for name, rs in ratios.items():
        lines.append(_line(name + (" *" if name in calibrated_on else ""), rs))
    lines.append(_line("ALL", [r for rs in ratios.values() for r in rs], True))
    outside = [r for name, rs in ratios.items() if name not in calibrated_on for r in rs]
    if outside:
        lines.append(_line("ALL without *", outside, True))
    return "\n".join(lines)


def _describe(hw: Hardware) -> str:
    fam = " ".join(f"{k}={v:.2g}" for k, v in hw.family_efficiency.items())
    floors = " ".join(f"{k}={v * 1e6:.1f}" for k, v in hw.family_launch_s.items())
    return (
        f"# profile={hw.name} bandwidth={hw.memory_bandwidth / 1e9:.1f} GB/s launch={hw.launch_s * 1e6:.2f} us "
        f"vector={ {k: f'{v / 1e9:.2f}G' for k, v in hw.vector.items()} } "
        f"tensor={ {k: f'{v / 1e9:.1f}G' for k, v in hw.tensor.items()} }\n"
        f"#   family efficiency: {fam or '-'}\n#   family floors (us): {floors or '-'}"
    )


def main(argv: list[str] | None = None) -> None:
    global _CLOCK
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--hardware", default=None, help="profile name (default: calibrated + static cpu on cpu, h100 on cuda)")
    p.add_argument("--calibrate", action="store_true", help="measure a profile (always on cpu without --hardware)")
    p.add_argument("--sizes", default="16384,131072,1048576", help="comma-separated element counts")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads on cpu (default 1)")
    p.add_argument("--wall", action="store_true", help="cpu: time with the wall clock, not process CPU time")
    p.add_argument("--reps", type=int, default=5, help="timed batches per point (median)")
    p.add_argument("--print-profile", action="store_true", help="print the calibrated profile as Python and exit")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA device visible")
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
        _CLOCK = time.perf_counter if args.wall or args.threads != 1 else time.process_time
    t_start = time.perf_counter()
    profiles: list[Hardware] = []
    if args.hardware and not args.calibrate:
        profiles = [get_hardware(args.hardware)]
    elif args.device == "cuda" and not args.calibrate:
        profiles = [get_hardware("h100")]
    else:
        profiles = [calibrate(args.device)]
        if args.device == "cpu" and not args.hardware:
            profiles.append(get_hardware("cpu"))
    if args.print_profile:
        print(profile_source(profiles[0]))
        return
    clock = "wall" if _CLOCK is time.perf_counter else "process CPU"
    print(f"# device={args.device} torch={torch.__version__} threads={torch.get_num_threads()} clock={clock} "
          f"load={os.getloadavg()[0]:.1f}")
    for hw in profiles:
        print(_describe(hw))
    sizes = [int(s) for s in args.sizes.split(",")]
    ratios: list[dict[str, list[float]]] = [{} for _ in profiles]
    calib = _calibration_packets()
    calibrated_on: set[str] = set()
    for n in sizes:
        for case in cases(n, args.device):
            name, op, a, kw = case
            if getattr(op, "overloadpacket", None) in calib:
                calibrated_on.add(name)
            cost = estimate(op, *a, **kw)
            measured = measure(_call(case), args.device, reps=args.reps)
            for hw, rs in zip(profiles, ratios):
                rs.setdefault(name, []).append(runtime(cost, hw) / measured)
    for hw, rs in zip(profiles, ratios):
        print(f"\n## profile {hw.name}")
        print(_summary(rs, len(sizes), calibrated_on))
    print(f"\n# {time.perf_counter() - t_start:.0f} s, load={os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

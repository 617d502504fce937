"""Predicted vs measured op time: how good is the roofline cost model?

For each op in the issue list over a size sweep, predicts ``runtime(estimate(op, ...), hw)``
and measures the op; prints the ratio predicted/measured per op (median, p10, p90) and overall.

CPU (default): the profile is calibrated first by a short microbenchmark (dispatch floor,
copy bandwidth, cache-resident vector throughput per dtype, matmul throughput), so the
ratios measure the *model* (which ops are compute vs memory bound, byte/flop counts),
not the datasheet. GPU: ``--device cuda --hardware h100`` (or h200/a100/b200) uses the
datasheet profile; ``--calibrate`` builds a measured one instead.

    PYTHONPATH=$PWD python benchmarks/cost_model_accuracy.py            # ~1 minute on 2 cores
    PYTHONPATH=$PWD python benchmarks/cost_model_accuracy.py --device cuda --hardware h100
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

import dtensor_rules  # noqa: F401
from dtensor_rules.costs import Hardware, estimate, get_hardware, runtime

aten = torch.ops.aten


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure(fn: Callable[[], Any], device: str, min_s: float = 0.01, reps: int = 5) -> float:
    """Median seconds per call over ``reps`` batches of at least ``min_s`` each."""
    fn()
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    one = max(time.perf_counter() - t0, 1e-7)
    loops = max(1, int(min_s / one))
    times = []
    for _ in range(reps):
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(loops):
            fn()
        _sync(device)
        times.append((time.perf_counter() - t0) / loops)
    return statistics.median(times)


def _minus_floor(t: float, launch: float) -> float:
    """Time net of the dispatch floor, never below a tenth of the measurement (noise guard)."""
    return max(t - launch, 0.1 * t)


def calibrate(device: str) -> Hardware:
    """A measured profile: dispatch floor, copy bandwidth, vector and matmul throughput."""
    launch = measure(lambda: torch.add(one, one), device) if (one := torch.ones(1, device=device)) is not None else 0
    n = 1 << 24
    src, dst = torch.empty(n, device=device), torch.empty(n, device=device)
    bandwidth = 2 * n * 4 / _minus_floor(measure(lambda: dst.copy_(src), device), launch)
    vector = {}
    m = 1 << 16  # cache resident (<= 512 KB), so the add is compute/issue bound
    for cls, dtype in (("fp32", torch.float32), ("fp64", torch.float64), ("fp16", torch.bfloat16),
                       ("int32", torch.int32), ("int64", torch.int64), ("int8", torch.int8)):
        x, y, z = (torch.ones(m, dtype=dtype, device=device) for _ in range(3))
        vector[cls] = m / _minus_floor(measure(lambda: torch.add(x, y, out=z), device), launch)
    tensor = {}
    k = 512
    for cls, dtype in (("fp32", torch.float32), ("fp16", torch.bfloat16)):
        a, b = torch.randn(k, k, device=device, dtype=dtype), torch.randn(k, k, device=device, dtype=dtype)
        tensor[cls] = 2 * k**3 / measure(lambda: torch.mm(a, b), device)
    return Hardware(
        f"calibrated-{device}", bandwidth, vector, tensor, compute_efficiency=1.0, memory_efficiency=1.0,
        launch_s=launch, source="measured by benchmarks/cost_model_accuracy.py",
    )


def cases(n: int, device: str) -> list[tuple[str, Any, tuple, dict]]:
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
        ("prims.fma", torch.ops.prims.fma.default, (x, x, x), {}),
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
    ]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--hardware", default=None, help="profile name (default: calibrated on cpu, h100 on cuda)")
    p.add_argument("--calibrate", action="store_true", help="measure a profile (always on cpu without --hardware)")
    p.add_argument("--sizes", default="16384,131072,1048576", help="comma-separated element counts")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA device visible")
    if args.hardware and not args.calibrate:
        hw = get_hardware(args.hardware)
    elif args.device == "cuda" and not args.calibrate:
        hw = get_hardware("h100")
    else:
        hw = calibrate(args.device)
    print(f"# device={args.device} torch={torch.__version__} threads={torch.get_num_threads()} profile={hw.name}")
    print(f"# bandwidth={hw.memory_bandwidth / 1e9:.1f} GB/s launch={hw.launch_s * 1e6:.2f} us "
          f"vector={ {k: f'{v / 1e9:.1f}G' for k, v in hw.vector.items()} } "
          f"tensor={ {k: f'{v / 1e9:.1f}G' for k, v in hw.tensor.items()} }")
    ratios: dict[str, list[float]] = {}
    for n in (int(s) for s in args.sizes.split(",")):
        for name, op, a, kw in cases(n, args.device):
            predicted = runtime(estimate(op, *a, **kw), hw)
            measured = measure(lambda: op(*a, **kw), args.device)
            ratios.setdefault(name, []).append(predicted / measured)
    print(f"{'op':26s} {'median':>8s} {'p10':>8s} {'p90':>8s}   (predicted / measured, {len(args.sizes.split(','))} sizes)")
    every = []
    for name, rs in ratios.items():
        every += rs
        p10, med, p90 = np.percentile(rs, [10, 50, 90])
        print(f"{name:26s} {med:8.2f} {p10:8.2f} {p90:8.2f}")
    p10, med, p90 = np.percentile(every, [10, 50, 90])
    within = np.mean([(0.5 <= r <= 2.0) for r in every])
    print(f"{'ALL':26s} {med:8.2f} {p10:8.2f} {p90:8.2f}   within 2x: {within:.0%} of {len(every)}")


if __name__ == "__main__":
    main()

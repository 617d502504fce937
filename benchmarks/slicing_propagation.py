"""Cold sharding-propagation cost of cat / slice_scatter, ours vs upstream, in one run.

Each call is dispatched on DTensors over meta tensors on a fake process group with every
sharding cache cleared first (DTensor's and our row caches: ``--warm-rows`` keeps the
latter); "upstream" is the same call with our rules uninstalled. Prints per case the best
of ``--reps`` calls each side, their ratio, and how many strategies our rule priced.

    python benchmarks/slicing_propagation.py                  # meshes 8, 8x8, 8x8x8, 2x2x2x8
    python benchmarks/slicing_propagation.py --mesh 8x8 --reps 20

Cases marked [unfavourable]: many small inputs, uneven sizes, Partial inputs that must move.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

import dtensor_rules
from dtensor_rules._upstream import clear_sharding_caches, propagator
from dtensor_rules.ops.slicing import cat_rows, slice_scatter_rows
from dtensor_rules.testing import fake_world

aten = torch.ops.aten
TOKENS, HIDDEN = 4096, 2048  # MoE-like activations, bf16


def _cases(mesh: DeviceMesh) -> list[tuple[str, Callable[[], object]]]:
    nd = mesh.ndim

    def dt(shape: tuple[int, ...], pl: list, dtype: torch.dtype = torch.bfloat16) -> DTensor:
        local = torch.empty(shape, dtype=dtype, device="meta")
        return DTensor.from_local(local, mesh, pl, run_check=False, shape=torch.Size(shape), stride=local.stride())

    R = [Replicate()] * nd
    S0 = [Shard(0)] + [Replicate()] * (nd - 1)
    S0_all = [Shard(0)] * nd  # tokens split over every mesh dim
    P = [Partial("sum")] + [Replicate()] * (nd - 1)
    T, H = TOKENS, HIDDEN
    return [
        ("cat tokens S0, hidden+64 (MoE concat)", lambda: torch.cat([dt((T, H), S0), dt((T, 64), S0)], 1)),
        ("cat tokens S0 on all mesh dims", lambda: torch.cat([dt((T, H), S0_all), dt((T, H), S0_all)], 1)),
        ("cat R on the cat dim", lambda: torch.cat([dt((T, H), R), dt((T, H), R)], 0)),
        ("cat 6 x R (4,3) [unfavourable]", lambda: torch.cat([dt((4, 3), R, torch.float32) for _ in range(6)], 0)),
        ("cat 6 x P/R mixed [unfavourable]",
         lambda: torch.cat([dt((4, 3), P if i % 2 else R, torch.float32) for i in range(6)], 0)),
        ("cat 3 uneven S0 [unfavourable]",
         lambda: torch.cat([dt((T + 3, 7), S0), dt((T + 3, 5), S0), dt((T + 3, 1), S0)], 1)),
        ("slice_scatter S0 (hidden slice)", lambda: aten.slice_scatter.default(dt((T, H), S0), dt((T, 512), S0), 1, 0, 512)),
        ("slice_scatter R (token slice)", lambda: aten.slice_scatter.default(dt((T, H), R), dt((1024, H), R), 0, 1024, 2048)),
        ("slice_scatter S1 self, R src, step 2 [unfavourable]",
         lambda: aten.slice_scatter.default(dt((T + 1, H + 3), [Shard(1)] + [Replicate()] * (nd - 1)),
                                            dt((T + 1, 3), R), 1, 0, 6, 2)),
    ]


def _clear(warm_rows: bool) -> None:
    clear_sharding_caches()
    if not warm_rows:
        cat_rows.cache_clear()
        slice_scatter_rows.cache_clear()


def _best(fn: Callable[[], object], reps: int, warm_rows: bool) -> float:
    times = []
    for _ in range(reps):
        _clear(warm_rows)
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def _priced(fn: Callable[[], object]) -> int:
    """How many strategies the active rule handed to the min-cost selection on a cold call."""
    prop = propagator()
    counts: list[int] = []
    originals = dict(prop.op_strategy_funcs)
    for op in (aten.cat.default, aten.slice_scatter.default):
        if op in originals:
            f = originals[op]
            prop.op_strategy_funcs[op] = lambda schema, f=f: (lambda s: (counts.append(len(s.strategies)), s)[1])(f(schema))
    try:
        clear_sharding_caches()
        fn()
    finally:
        prop.op_strategy_funcs.update(originals)
    return counts[-1] if counts else -1


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mesh", action="append", help="e.g. 8x8 (repeatable)")
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--warm-rows", action="store_true", help="keep our row caches between calls")
    args = parser.parse_args(argv)
    meshes = [tuple(int(x) for x in m.split("x")) for m in (args.mesh or ["8", "8x8", "8x8x8", "2x2x2x8"])]
    ratios = []
    print(f"{'mesh':>8s}  {'case':52s} {'ours ms':>8s} {'upstream ms':>11s} {'ratio':>6s} {'priced':>6s}")
    for shape in meshes:
        with fake_world(math.prod(shape)):
            mesh = init_device_mesh("cpu", shape)
            for name, fn in _cases(mesh):
                dtensor_rules.install()
                fn()
                ours = _best(fn, args.reps, args.warm_rows)
                priced = _priced(fn)
                dtensor_rules.uninstall()
                fn()
                upstream = _best(fn, args.reps, args.warm_rows)
                dtensor_rules.install()
                ratios.append(ours / upstream)
                print(f"{'x'.join(map(str, shape)):>8s}  {name:52s} {ours * 1e3:8.2f} {upstream * 1e3:11.2f} "
                      f"{ours / upstream:6.2f} {priced:6d}", flush=True)
    print(f"\nratio ours/upstream: median {statistics.median(ratios):.2f}, max {max(ratios):.2f} over {len(ratios)} cases")


if __name__ == "__main__":
    main()

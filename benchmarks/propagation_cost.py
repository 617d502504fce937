"""Cold sharding propagation, ours / upstream, for the scan, gather/scatter, indexing and counting
families on fake-PG meshes (#10). Upstream = the same call with our rules uninstalled.

"Cold": every timed propagation starts from cleared sharding caches
(``dtensor_rules._upstream.clear_sharding_caches``) and runs DTensor's uncached propagation
(``propagate_op_sharding_non_cached``: the rule, its expansion to the mesh, the cost-based choice).
Ops upstream has no rule for are reported with ours only. Unfavourable cases are labelled: uneven
shapes, a 4-D mesh, many index tensors.

usage: python benchmarks/propagation_cost.py [--reps N] [--mesh 8 --mesh 8x8 ...]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

os.environ.setdefault("DTENSOR_RULES_NO_INSTALL", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402
from torch.distributed.tensor.placement_types import Replicate, Shard  # noqa: E402

import dtensor_rules  # noqa: E402
from dtensor_rules._upstream import clear_sharding_caches, dispatcher  # noqa: E402
from dtensor_rules.testing import fake_world  # noqa: E402

aten = torch.ops.aten
MESHES = [(8,), (8, 8), (8, 8, 8), (4, 4, 4, 4)]


def _dt(t: torch.Tensor, mesh, placements) -> DTensor:
    """A DTensor of global value ``t`` on a fake mesh (the local tensor is the whole value: shapes only matter)."""
    pl = list(placements) + [Replicate()] * (mesh.ndim - len(placements))
    return DTensor.from_local(t, mesh, pl, run_check=False, shape=t.shape, stride=t.stride())


def cases(mesh) -> dict[str, tuple]:
    n = mesh.ndim
    S0, S1, R = [Shard(0)] * 1, [Shard(1)], [Replicate()]
    x = torch.randn(64, 32)
    xu = torch.randn(61, 37)  # uneven on every mesh size
    idx = torch.randint(0, 64, (48, 32))
    src = torch.randn(48, 32)
    i1 = torch.randint(0, 64, (40,))
    v = torch.randn(40, 32)
    return {
        "cumsum": (aten.cumsum.default, (_dt(x, mesh, S0 * min(n, 1)), 1), {}),
        "cumsum uneven": (aten.cumsum.default, (_dt(xu, mesh, S1), 0), {}),
        "gather": (aten.gather.default, (_dt(x, mesh, R), 0, _dt(idx, mesh, S0)), {}),
        "scatter_add": (aten.scatter_add.default, (_dt(x, mesh, R), 0, _dt(idx, mesh, S0), _dt(src, mesh, S0)), {}),
        "scatter.src": (aten.scatter.src, (_dt(x, mesh, S1), 0, _dt(idx, mesh, S1), _dt(src, mesh, S1)), {}),
        "scatter_reduce sum": (aten.scatter_reduce.two, (_dt(x, mesh, R), 0, _dt(idx, mesh, S0), _dt(src, mesh, S0), "sum"), {}),
        "index": (aten.index.Tensor, (_dt(x, mesh, S1), [_dt(i1, mesh, R)]), {}),
        "index 3 idx (many inputs)": (aten.index.Tensor, (_dt(torch.randn(8, 8, 8, 4), mesh, R), [_dt(torch.randint(0, 8, (5,)), mesh, S0)] * 3), {}),
        "index_put acc": (aten.index_put.default, (_dt(x, mesh, R), [_dt(i1, mesh, S0)], _dt(v, mesh, S0), True), {}),
        "histc": (aten.histc.default, (_dt(x, mesh, S0), 8, -1.0, 1.0), {}),
    }


def cold_us(op, args, kwargs, reps: int) -> float | None:
    d = dispatcher()
    times = []
    for _ in range(reps):
        clear_sharding_caches()
        info = d.unwrap_to_op_info(op, args, kwargs)
        t0 = time.perf_counter()
        try:
            d.sharding_propagator.propagate_op_sharding_non_cached(info.schema)
        except Exception:  # noqa: BLE001  (upstream has no rule)
            return None
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--mesh", action="append", help="e.g. 8x8; default (8,), (8,8), (8,8,8), (4,4,4,4)")
    a = ap.parse_args()
    meshes = [tuple(int(s) for s in m.split("x")) for m in a.mesh] if a.mesh else MESHES
    ratios: dict[str, list[float]] = {}
    print("cold sharding propagation (median of reps, caches cleared each time), ours / upstream")
    for shape in meshes:
        with fake_world(math.prod(shape)):
            mesh = init_device_mesh("cpu", shape)
            print(f"\nmesh {shape}" + ("  [unfavourable: 4-D]" if len(shape) == 4 else ""))
            print(f"  {'op':28s} {'upstream us':>12s} {'ours us':>9s} {'ratio':>7s}")
            for name, (op, args, kwargs) in cases(mesh).items():
                dtensor_rules.uninstall()
                up = cold_us(op, args, kwargs, a.reps)
                dtensor_rules.install()
                ours = cold_us(op, args, kwargs, a.reps)
                r = f"{ours / up:.2f}x" if up and ours else "n/a"
                if up and ours:
                    ratios.setdefault(name, []).append(ours / up)
                print(f"  {name:28s} {up or float('nan'):12.0f} {ours or float('nan'):9.0f} {r:>7s}")
    allr = [r for v in ratios.values() for r in v]
    if allr:
        print(f"\nall meshes: median ratio {statistics.median(allr):.2f}x, max {max(allr):.2f}x "
              f"({max(ratios, key=lambda k: max(ratios[k]))})")


if __name__ == "__main__":
    main()

"""Per-call time of ``x[idx]`` on DTensors with a warm sharding cache, ours / upstream, on a real
2-rank gloo group (#10.5). Upstream = the same call with our rules and patches uninstalled.

Cases (labelled): long indices (the common MoE gather; must stay on DTensor's C++ fast path:
target <= 1.1x), long indices on a sharded self, several index tensors, and bool masks (ours
only: upstream cannot run them at all, so only our time is printed). Also bincount through its
handler (cached choice) against a plain local bincount + DTensor wrap as the floor.

usage: python benchmarks/index_dispatch.py [--calls N] [--repeats R] [--fake]
(--fake: one process on a 2-rank fake group, dispatch alone; see _dispatch_rounds.run_rounds)
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("DTENSOR_RULES_NO_INSTALL", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from _dispatch_rounds import interleaved_rounds, run_rounds  # noqa: E402


def _cases(mesh):
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    g = torch.Generator().manual_seed(0)
    x = distribute_tensor(torch.randn(512, 64, generator=g), mesh, [Replicate()])
    xs = distribute_tensor(torch.randn(512, 64, generator=g), mesh, [Shard(1)])
    i = distribute_tensor(torch.randint(0, 512, (256,), generator=g), mesh, [Replicate()])
    i_uneven = distribute_tensor(torch.randint(0, 512, (37,), generator=g), mesh, [Shard(0)])
    j = distribute_tensor(torch.randint(0, 64, (256,), generator=g), mesh, [Replicate()])
    m = distribute_tensor(torch.rand(512, generator=g) > 0.5, mesh, [Replicate()])
    return {
        "long idx, self R": lambda: x[i],
        "long idx, self S(1)": lambda: xs[i],
        "long idx S(0) uneven (37 rows)": lambda: x[i_uneven],
        "two index tensors": lambda: x[i, j],
        "bool mask (slow path by design)": lambda: x[m],
    }


def _worker(rank: int, world: int, calls: int, repeats: int) -> dict[str, tuple[float | None, ...]]:
    """Per case, the median and min of each side's rounds (upstream cannot size x[mask]: None)."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    return {k: v.summary() for k, v in interleaved_rounds(lambda: _cases(mesh), calls, repeats).items()}


def main() -> None:
    res, a = run_rounds(_worker)
    print(f"index.Tensor per call, warm cache, 2-rank {a.group} (rank 0), median of {a.repeats} interleaved rounds of {a.calls} calls")
    print("(min of rounds is the least load-disturbed estimate of per-call overhead on a shared machine)")
    print(f"{'case':36s} {'upstream us':>12s} {'ours us':>9s} {'ratio':>7s} | {'min up us':>9s} {'min ours':>9s} {'ratio':>7s}")
    for name, (up, ours, up_min, ours_min) in res.items():
        r = lambda a, b: f"{b / a:.2f}x" if a else "n/a"  # noqa: E731
        nan = float("nan")
        print(f"{name:36s} {up or nan:12.1f} {ours:9.1f} {r(up, ours):>7s} | {up_min or nan:9.1f} {ours_min:9.1f} {r(up_min, ours_min):>7s}")


if __name__ == "__main__":
    main()

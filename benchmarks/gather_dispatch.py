"""Per-call time of ``torch.gather`` on DTensors with a warm sharding cache, ours / upstream, on a
real 2-rank gloo group. Upstream = the same call with our rules and patches uninstalled.

Cases (labelled): no masked strategy (self and index replicated; index sharded on the gather
dim), the masked strategy both sides offer (self sharded on the gather dim, one index per
row: upstream's ``_MaskPartial``, ours ``IndexMaskPartial``), and self sharded on the gather dim
with a wider index, where upstream all-gathers self and ours masks. The output is left as it
is (a masked partial is not reduced), so the time is the gather's dispatch, redistribution of
its inputs and the local kernel; one case also reduces it (upstream masks then, ours at the
gather).

usage: python benchmarks/gather_dispatch.py [--calls N] [--repeats R]
"""

from __future__ import annotations

from typing import Any

import os
import sys

os.environ.setdefault("DTENSOR_RULES_NO_INSTALL", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from _dispatch_rounds import interleaved_rounds, run_rounds  # noqa: E402


def _cases(mesh):
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 512, generator=g)
    xr, xs = distribute_tensor(x, mesh, [Replicate()]), distribute_tensor(x, mesh, [Shard(1)])
    i = torch.randint(0, 512, (256, 8), generator=g)
    ir, i_rows = distribute_tensor(i, mesh, [Replicate()]), distribute_tensor(i, mesh, [Shard(1)])
    one = distribute_tensor(i[:, :1].contiguous(), mesh, [Replicate()])
    return {
        "self R, index R": lambda: torch.gather(xr, 1, ir),
        "self R, index S(1)": lambda: torch.gather(xr, 1, i_rows),
        "self S(1), index R (256, 1): masked": lambda: torch.gather(xs, 1, one),
        "  same, then reduced (.full_tensor())": lambda: torch.gather(xs, 1, one).full_tensor(),
        "self S(1), index R (256, 8)": lambda: torch.gather(xs, 1, ir),
    }


def _worker(rank: int, world: int, calls: int, repeats: int) -> dict[str, tuple[Any, ...]]:
    """Per case, the median and min of each side's rounds, and each side's output placement."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    placement = lambda out: str(out.placements[0]) if hasattr(out, "placements") else "plain"  # noqa: E731
    return {
        name: (*case.summary(), placement(case.result["upstream"]), placement(case.result["ours"]))
        for name, case in interleaved_rounds(lambda: _cases(mesh), calls, repeats).items()
    }


def main() -> None:
    res, a = run_rounds(_worker)
    print(f"torch.gather per call, warm cache, 2-rank {a.group} (rank 0), torch {torch.__version__}, "
          f"median of {a.repeats} interleaved rounds of {a.calls} calls (min of rounds: least load-disturbed)")
    print(f"{'case':38s} {'upstream us':>11s} {'ours us':>8s} {'ratio':>6s} | {'min up':>7s} {'min ours':>8s} {'ratio':>6s} | output (up / ours)")
    for name, (up, ours, up_min, ours_min, p_up, p_ours) in res.items():
        print(f"{name:38s} {up:11.1f} {ours:8.1f} {ours / up:5.2f}x | {up_min:7.1f} {ours_min:8.1f} "
              f"{ours_min / up_min:5.2f}x | {p_up} / {p_ours}")


if __name__ == "__main__":
    main()

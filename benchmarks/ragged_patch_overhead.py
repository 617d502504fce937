"""What the two ragged patches cost a DTensor redistribute that has nothing ragged in it.

``ragged_redistribute`` wraps ``DTensor.redistribute`` and ``ragged_guard`` wraps
``redistribute_local_tensor``: each adds a scan of the placements to every call. This times
``Shard(0) -> Replicate`` of a small DTensor on a fake 2-rank group (rank 0; the collective is a
no-op, so the Python path dominates), alternating patches on / off in one process, and prints the
min and median per call of each and their ratio. One process, single-threaded:

    PYTHONPATH=src python benchmarks/ragged_patch_overhead.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import timeit

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

import dtensor_rules
from dtensor_rules import patches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    dist.init_process_group("fake", rank=0, world_size=2)
    mesh = init_device_mesh("cpu", (2,))
    y = distribute_tensor(torch.randn(8, 4), mesh, [Shard(0)])
    without = [n for n in patches.defaults() if not n.startswith("ragged")]
    per_call: dict[str, list[float]] = {"ragged patches off": [], "ragged patches on": []}
    for _ in range(args.rounds):
        for name, applied in (("ragged patches off", without), ("ragged patches on", patches.defaults())):
            with dtensor_rules.installed(patches=applied):
                best = min(timeit.repeat(lambda: y.redistribute(mesh, [Replicate()]), number=300, repeat=3))
                per_call[name].append(best / 300 * 1e6)
    print(f"torch {torch.__version__}: Shard(0) -> Replicate, fake 2-rank group, {args.rounds} rounds")
    for name, times in per_call.items():
        print(f"  {name:20s} min {min(times):7.1f} us   median {statistics.median(times):7.1f} us")
    off, on = (statistics.median(per_call[k]) for k in per_call)
    print(f"  median on / off: {on / off:.2f}x")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

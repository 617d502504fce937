"""What a routing-dependent placement costs in eager: sharding-cache hit vs miss per op.

Design spike for issue 19 (docs/design/ragged_expert_placement.md, section 3). A ``Shard``
subclass whose eq/hash include a per-step value (standing in for partition sizes) misses
DTensor's sharding caches on every new value. One fake process group of 2 ranks; times
``DTensor.from_local(...).neg()`` with the same placement value (hits) and with a new one
per call (misses), upstream alone or with the package installed:

    PYTHONPATH=src python benchmarks/experiments/ragged_miss_cost.py upstream
    PYTHONPATH=src python benchmarks/experiments/ragged_miss_cost.py package

One run, a shared 2-core CPU: read the ratio, not the microseconds.
"""

from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard


class KeyedShard(Shard):
    """Shard(dim) plus a hashed per-step key (what sizes in the placement amount to)."""

    def __init__(self, dim: int, key: int) -> None:
        super().__init__(dim)
        self.key = key

    def __eq__(self, other: object) -> bool:
        return type(other) is KeyedShard and (self.dim, self.key) == (other.dim, other.key)

    def __ne__(self, other: object) -> bool:  # _dtensor_spec.py:392 workaround, see the design doc
        return False if (type(other) is Shard and other.dim == self.dim) else not self.__eq__(other)

    def __hash__(self) -> int:
        return hash((self.dim, self.key))


def main(mode: str) -> None:
    if mode == "package":
        import dtensor_rules  # noqa: F401  (installs the package's rules)
    dist.init_process_group("fake", rank=0, world_size=2)
    mesh = init_device_mesh("cpu", (2,))
    loc = torch.randn(6, 3)

    def per_call_us(fresh: bool, calls: int = 30) -> float:
        t0 = time.perf_counter()
        for i in range(calls):
            p = KeyedShard(0, i if fresh else -1)
            DTensor.from_local(loc, mesh, (p,), run_check=False, shape=(11, 3), stride=(3, 1)).neg()
        return (time.perf_counter() - t0) / calls * 1e6

    per_call_us(False)
    hit, miss = per_call_us(False), per_call_us(True)
    print(f"torch {torch.__version__} {mode}: from_local+neg per call: cache hit {hit:.0f} us, "
          f"new key each call {miss:.0f} us ({miss / hit:.0f}x)")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "upstream")

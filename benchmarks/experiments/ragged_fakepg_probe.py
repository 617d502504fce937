"""Feasibility probe on a fake process group: torch.compile (Dynamo + aot_eager), DCP write items,
and the eager cost of a sharding-cache miss per routing, for a user-defined ragged placement.

Design spike for issue 19 (docs/design/ragged_expert_placement.md); pokes torch privates on
purpose, like ``ragged_placement_probe.py`` whose ``RaggedShard`` it reuses. One fake
process group of 2 ranks (this process is rank 0; collectives return placeholders, which
is enough to see what traces):

    PYTHONPATH=src python benchmarks/experiments/ragged_fakepg_probe.py

Each probe compiles with ``fullgraph=True`` so a graph break is reported as a failure.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard

sys.path.insert(0, os.path.dirname(__file__))
import ragged_placement_probe as rp  # noqa: E402

COUNTS = rp.COUNTS


def probe(name: str, fn: Callable[[], str | None]) -> None:
    torch._dynamo.reset()
    try:
        note = fn()
        print(f"OK    {name}: {note or ''}")
    except Exception as e:  # noqa: BLE001 - a probe reports every failure
        msg = " ".join(str(e).split())
        where = traceback.extract_tb(e.__traceback__)[-1]
        print(f"FAIL  {name}: {type(e).__name__}: {msg[:260]} [at {where.filename.split('site-packages/')[-1]}:{where.lineno}]")


def main() -> None:
    dist.init_process_group("fake", rank=0, world_size=2)
    mesh = init_device_mesh("cpu", (2,))
    un = rp.RaggedShard(0, COUNTS, False)
    n = sum(map(sum, COUNTS))
    local = torch.randn(sum(COUNTS[0]), 3)  # rank 0's unaligned rows

    def mk() -> DTensor:
        return DTensor.from_local(local, mesh, (un,), run_check=False, shape=(n, 3), stride=(3, 1))

    def graph_input():
        f = torch.compile(lambda x: x.to_local() * 2, backend="aot_eager", fullgraph=True)
        out = f(mk())
        return f"to_local of a ragged DTensor input: shape {tuple(out.shape)}"
    probe("ragged DTensor as a graph input", graph_input)

    def construct_inside():
        def f(t):
            d = DTensor.from_local(t, mesh, (rp.RaggedShard(0, COUNTS, False),), run_check=False,
                                   shape=(n, 3), stride=(3, 1))
            return d.to_local() + 1
        torch.compile(f, backend="aot_eager", fullgraph=True)(local)
    probe("RaggedShard(...) constructed inside the compiled region", construct_inside)

    def redistribute_inside():
        f = torch.compile(lambda x: x.redistribute(mesh, (Replicate(),)).to_local(), backend="aot_eager",
                          fullgraph=True)
        return f"shape {tuple(f(mk()).shape)}"
    probe("ragged -> Replicate redistribute inside the region (custom hook)", redistribute_inside)

    def unbacked_sizes():
        torch._dynamo.config.capture_scalar_outputs = True

        def f(t, counts):
            c = counts.tolist()  # unbacked SymInts
            sizes = (tuple(c[:4]), tuple(c[4:]))
            d = DTensor.from_local(t, mesh, (rp.RaggedShard(0, sizes, False),), run_check=False,
                                   shape=(n, 3), stride=(3, 1))
            return d.to_local() * 2
        torch.compile(f, backend="aot_eager", fullgraph=True)(local, torch.tensor(sum(COUNTS, ())))
    probe("RaggedShard holding unbacked SymInt sizes (from counts.tolist())", unbacked_sizes)

    def recompiles():
        counters = torch._dynamo.utils.counters
        counters.clear()
        f = torch.compile(lambda x: x.to_local() * 2, backend="aot_eager", fullgraph=True)
        for step in range(3):  # three routings, same global and local shapes on this rank
            c = ((3, 0, 2, 1), (1, 4 - step, step, 0))
            f(DTensor.from_local(local, mesh, (rp.RaggedShard(0, c, False),), run_check=False, shape=(n, 3),
                                 stride=(3, 1)))
        return f"frames compiled for 3 routings: {counters['stats']['unique_graphs']}"
    probe("host-int sizes in the placement: recompiles per routing", recompiles)

    def dcp_items():
        from torch.distributed.checkpoint.planner_helpers import _create_write_items
        out = []
        for aligned in (True, False):
            loc = torch.randn(len(rp._rows_of(COUNTS, 0, aligned)), 3)
            d = DTensor.from_local(loc, mesh, (rp.RaggedShard(0, COUNTS, aligned),), run_check=False,
                                   shape=(n, 3), stride=(3, 1))
            (item,) = _create_write_items("w", d)
            ch = item.tensor_data.chunk
            out.append(f"{'aligned' if aligned else 'unaligned'}: chunk offsets={tuple(ch.offsets)} sizes={tuple(ch.sizes)}"
                       f" (true rows {rp._rows_of(COUNTS, 0, aligned)})")
        return "; ".join(out)
    probe("DCP write items of rank 0 (offset + size = one contiguous box)", dcp_items)

    def miss_cost():
        import time

        routings = [((a, 3 - a, 2, 1), (b, 5 - b, 0, 0)) for a in range(4) for b in range(6)]  # 24, same sizes on rank 0

        def run(fresh: bool) -> float:
            t0 = time.perf_counter()
            for c in routings:
                d = DTensor.from_local(local, mesh, (rp.RaggedShard(0, c if fresh else COUNTS, False),),
                                       run_check=False, shape=(n, 3), stride=(3, 1))
                d.neg()
            return (time.perf_counter() - t0) / len(routings) * 1e6
        run(False)
        same, fresh = run(False), run(True)
        return (f"from_local + neg per call: same routing {same:.0f} us, new routing each call {fresh:.0f} us "
                f"(+{fresh - same:.0f} us per op per step: one sharding-propagation miss)")
    probe("eager cost of sizes-in-the-placement (a cache miss per op per routing)", miss_cost)

    def opaque_registered():
        from torch._library.opaque_object import is_opaque_type
        return f"Shard opaque={is_opaque_type(Shard)}, RaggedShard opaque={is_opaque_type(rp.RaggedShard)}"
    probe("placements registered as opaque value types (placement_types.py end)", opaque_registered)
    dist.destroy_process_group()


if __name__ == "__main__":
    print("torch", torch.__version__)
    main()

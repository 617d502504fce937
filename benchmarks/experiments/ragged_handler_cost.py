"""What routing an op through a per-op DTensor handler costs for tensors that are NOT ragged.

Design spike for issue 19 (docs/design/ragged_expert_placement.md, section 3): the ragged
context (counts) travels through the package's handlers on the ops of the MoE path, so those
ops leave DTensor's C++ fast path for every input, ragged or not. Times ``neg`` on an ordinary
``Shard(0)`` DTensor (fake process group, 2 ranks) with upstream's fast path and with a
handler that only delegates to the Python slow path (``dtensor_rules._upstream.dispatch_slow_path``):

    PYTHONPATH=src python benchmarks/experiments/ragged_handler_cost.py

One run on a shared CPU: read the ratio.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard

from dtensor_rules._upstream import custom_op_handlers, dispatch_slow_path


def per_call_us(x: DTensor, calls: int = 300) -> float:
    x.neg()
    t0 = time.perf_counter()
    for _ in range(calls):
        x.neg()
    return (time.perf_counter() - t0) / calls * 1e6


def main() -> None:
    dist.init_process_group("fake", rank=0, world_size=2)
    mesh = init_device_mesh("cpu", (2,))
    x = DTensor.from_local(torch.randn(6, 3), mesh, (Shard(0),), run_check=False, shape=(12, 3), stride=(3, 1))
    fast = per_call_us(x)
    handlers = custom_op_handlers()
    op = torch.ops.aten.neg.default

    def handler(op_call, args, kwargs):
        # a ragged-aware handler would look for a RaggedShard input here; none: upstream's path
        return dispatch_slow_path(op_call, args, kwargs)
    handlers[op] = handler
    try:
        slow = per_call_us(x)
    finally:
        del handlers[op]
    print(f"torch {torch.__version__}: neg on Shard(0): C++ fast path {fast:.0f} us, "
          f"through a delegating handler {slow:.0f} us ({slow / fast:.1f}x)")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Cold sharding propagation of ``_grouped_mm``, ``prims.fma`` and ``_softmax_backward_data``:
ours vs upstream (same call with our rules uninstalled), one run, fake process group.

Each measurement clears DTensor's sharding caches and times (CPU time) one dispatch of the op on DTensors
built with ``DTensor.from_local`` over meta tensors (no data), so it is the propagation cost
(strategy enumeration + min-cost selection + output meta). Realistic MoE shapes: bf16, thousands
of tokens, 64 experts. Unfavourable cases are labelled: uneven shapes (sizes that do not divide
the mesh), big fake meshes (512 ranks, a 4-D mesh).

    python benchmarks/moe_op_propagation.py            # all cases
    python benchmarks/moe_op_propagation.py --repeat 5
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

import dtensor_rules
from dtensor_rules._upstream import clear_sharding_caches, ensure_prims_fma
from dtensor_rules.testing import fake_world

MESHES = [(8,), (8, 8), (8, 8, 8), (2, 4, 4, 4)]
BF16 = torch.bfloat16


class Case(NamedTuple):
    name: str
    label: str  # "" or why it is unfavourable
    make: Callable[[Any], Callable[[], Any]]  # mesh -> the call to time


def _dt(mesh: Any, shape: tuple[int, ...], placements: list[Any], dtype: torch.dtype = BF16, stride: Any = None) -> DTensor:
    """A DTensor of global ``shape`` whose local tensor is an (uninitialised) meta-free empty shard."""
    placements = (placements + [Replicate()] * mesh.ndim)[: mesh.ndim]
    local = list(shape)
    for i, p in enumerate(placements):
        if isinstance(p, Shard):
            local[p.dim] = -(-local[p.dim] // mesh.shape[i])
    t = torch.empty(local, dtype=dtype, device="meta")
    return DTensor.from_local(t, mesh, placements, run_check=False, shape=torch.Size(shape),
                              stride=stride or torch.empty(shape, device="meta").stride())


def _gmm(tokens: int, hidden: int, ffn: int, experts: int, a_pl: str) -> Callable[[Any], Callable[[], Any]]:
    def make(mesh: Any) -> Callable[[], Any]:
        a = _dt(mesh, (tokens, hidden), [Shard(0)] if a_pl == "S0" else [Replicate()])
        w = _dt(mesh, (experts, hidden, ffn), [Replicate()] if a_pl == "S0" else [Shard(0)])
        offs = _dt(mesh, (experts,), [Replicate()], dtype=torch.int32)
        return lambda: torch._grouped_mm(a, w, offs=offs)

    return make


def _fma(shape: tuple[int, ...], pl: list[Any], c_pl: list[Any] | None = None) -> Callable[[Any], Callable[[], Any]]:
    def make(mesh: Any) -> Callable[[], Any]:
        ensure_prims_fma()
        fma = torch.ops.prims.fma.default
        a, b, c = _dt(mesh, shape, pl), _dt(mesh, shape[-1:], [Replicate()]), _dt(mesh, shape, c_pl or pl)
        return lambda: fma(a, b, c)

    return make


def _sbd(shape: tuple[int, ...], pl: list[Any], y_pl: list[Any] | None = None) -> Callable[[Any], Callable[[], Any]]:
    def make(mesh: Any) -> Callable[[], Any]:
        g, y = _dt(mesh, shape, pl), _dt(mesh, shape, y_pl or pl)
        return lambda: torch.ops.aten._softmax_backward_data.default(g, y, -1, BF16)

    return make


CASES = [
    Case("grouped_mm A(4096x512) S(0), W(64x512x1024) R", "", _gmm(4096, 512, 1024, 64, "S0")),
    Case("grouped_mm A(8192x2048) R, W(64x2048x1408) S(0)", "", _gmm(8192, 2048, 1408, 64, "R")),
    Case("grouped_mm A(4099x520) S(0), W(64x520x1000) R", "uneven", _gmm(4099, 520, 1000, 64, "S0")),
    Case("fma (4096, 1024) S(0) + bias row", "", _fma((4096, 1024), [Shard(0)])),
    Case("fma (4096, 1024) P(sum)", "partial input", _fma((4096, 1024), [Partial("sum")])),
    Case("fma (8, 4099, 1000) S(1)", "uneven, 3-D", _fma((8, 4099, 1000), [Shard(1)])),
    Case("fma (4096, 1024) a S(0), c S(1)", "no zero-cost strategy", _fma((4096, 1024), [Shard(0)], [Shard(1)])),
    Case("fma (4096, 1024) a P(avg), c P(max)", "mixed partials", _fma((4096, 1024), [Partial("avg")], [Partial("max")])),
    Case("softmax_bwd (4096, 64) S(0)", "", _sbd((4096, 64), [Shard(0)])),
    Case("softmax_bwd (4096, 64) g S(1), y S(0)", "softmax dim split", _sbd((4096, 64), [Shard(1)], [Shard(0)])),
    Case("softmax_bwd (8, 4099, 1000) S(1)", "uneven, 3-D", _sbd((8, 4099, 1000), [Shard(1)])),
]


def time_cold(call: Callable[[], Any], repeat: int) -> float:
    """Median CPU seconds of one dispatch after clearing every sharding cache (CPU time of this
    process: steadier than wall time on a shared machine; the work is single-threaded)."""
    call()  # warm-up: first-call imports and lazy initialisation are not propagation
    times = []
    for _ in range(repeat):
        clear_sharding_caches()
        t0 = time.process_time()
        call()
        times.append(time.process_time() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    print(f"| {'case':52s} | {'mesh':9s} | ours ms | upstream ms | ratio |")
    print(f"|{'-' * 54}|{'-' * 11}|---------|-------------|-------|")
    ratios = []
    for mesh_shape in MESHES:
        with fake_world(math.prod(mesh_shape)):
            mesh = init_device_mesh("cpu", mesh_shape)
            for case in CASES:
                call = case.make(mesh)
                dtensor_rules.install()
                ours = time_cold(call, args.repeat)
                dtensor_rules.uninstall()
                up = time_cold(call, args.repeat)
                dtensor_rules.install()
                ratios.append(ours / up)
                label = f"{case.name}{' [' + case.label + ']' if case.label else ''}"
                print(f"| {label:52s} | {'x'.join(map(str, mesh_shape)):9s} | {ours * 1e3:7.1f} | {up * 1e3:11.1f} | {ours / up:5.2f} |")
    print(f"\nmedian ratio {statistics.median(ratios):.2f}, max {max(ratios):.2f} over {len(ratios)} cases")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

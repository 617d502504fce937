"""Alpha-beta cost model: per-mesh-dim bandwidth and latency, collective formulas.

Ring-collective costs in microseconds (``n`` = group size, ``B`` = bytes):

=================  ====================================================
all_gather         base + (n-1)*lat + (n-1)/n * B_out / bw
reduce_scatter     base + (n-1)*lat + (n-1)/n * B_in  / bw
all_reduce         base + 2(n-1)*lat + 2(n-1)/n * B   / bw
all_to_all         base + (n-1)*lat + (n-1)/n * B_in  / bw + a2a_penalty
chunk / R->P       0 (local)
=================  ====================================================

A flattened collective over several mesh dims is priced on the combined group:
``n`` = product of sizes, ``bw`` = slowest member dim, ``lat`` = largest member latency.
``Topology.upstream_like`` reproduces torch's ``MeshTopoInfo`` + ``one_step_redistribute_cost``
numbers exactly for single-mesh-dim steps (bytes in GiB, bandwidth in GB/s, base 6.6 us,
all_to_all = all_gather of the local shard + 1 us), so plans can be compared on upstream's terms.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Topology", "COLLECTIVES"]

COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "chunk", "partition")
_GIB = 1024**3


@dataclass(frozen=True)
class Topology:
    """Per-mesh-dim bandwidth (GB/s, bytes counted in GiB) and per-hop latency (us)."""

    bandwidth: tuple[float, ...]
    latency: tuple[float, ...]
    base_latency: float = 6.6
    a2a_penalty: float = 0.0
    name: str = "custom"

    def __post_init__(self) -> None:
        if len(self.bandwidth) != len(self.latency):
            raise ValueError(f"bandwidth {self.bandwidth} and latency {self.latency} need one entry per mesh dim")
        if any(b <= 0 for b in self.bandwidth) or any(a < 0 for a in self.latency):
            raise ValueError("bandwidths must be > 0 and latencies >= 0")

    @property
    def ndim(self) -> int:
        return len(self.bandwidth)

    @staticmethod
    def uniform(mesh_ndim: int, bandwidth: float = 87.7, latency: float = 0.6, base_latency: float = 6.6) -> "Topology":
        """Every mesh dim on the same fabric."""
        return Topology((float(bandwidth),) * mesh_ndim, (float(latency),) * mesh_ndim, base_latency, 0.0, "uniform")

    @staticmethod
    def node_aware(
        mesh_shape: Sequence[int],
        gpus_per_node: int,
        intra_bw: float = 450.0,
        inter_bw: float = 25.0,
        intra_lat: float = 0.6,
        inter_lat: float = 5.0,
        base_latency: float = 6.6,
    ) -> "Topology":
        """Two tiers: trailing mesh dims whose product fits in a node are intra-node, the rest inter-node."""
        bw, lat, inner = [], [], 1
        for s in reversed(tuple(mesh_shape)):
            inner *= s
            fast = inner <= gpus_per_node
            bw.append(intra_bw if fast else inter_bw)
            lat.append(intra_lat if fast else inter_lat)
        return Topology(tuple(reversed(bw)), tuple(reversed(lat)), base_latency, 0.0, f"node_aware({gpus_per_node}/node)")

    @staticmethod
    def upstream_like(mesh_shape: Sequence[int], devices_per_host: int | None = None, device_type: str = "cpu") -> "Topology":
        """torch's MeshTopoInfo: 87.7 GB/s, 0.6 us; dims crossing hosts 0.22x bw and 2.7 us; a2a +1 us.

        ``devices_per_host=None`` asks torch, as MeshTopoInfo does (``device_count()``: 1 on CPU).
        """
        if devices_per_host is None:
            from dtensor_rules._upstream import num_devices_per_host

            devices_per_host = num_devices_per_host(device_type)
        bw, lat, total = [87.7] * len(mesh_shape), [0.6] * len(mesh_shape), 1
        for m in reversed(range(len(mesh_shape))):
            total *= mesh_shape[m]
            if total > devices_per_host:
                bw[m] *= 0.22
                lat[m] = 2.7
        return Topology(tuple(bw), tuple(lat), 6.6, 1.0, "upstream_like")

    def group(self, mesh_shape: Sequence[int], dims: Sequence[int]) -> tuple[int, float, float]:
        """(size, bandwidth, latency) of the flattened group over ``dims``."""
        return (
            math.prod(mesh_shape[d] for d in dims),
            min(self.bandwidth[d] for d in dims),
            max(self.latency[d] for d in dims),
        )

    def cost(self, kind: str, n: int, bw: float, lat: float, nbytes: float) -> float:
        """Cost in us of ``kind`` over a group of ``n`` ranks moving ``nbytes`` (see module table)."""
        if kind in ("chunk", "partition") or n == 1:
            return 0.0
        hops = n - 1
        gb = nbytes / _GIB
        if kind == "all_reduce":
            return self.base_latency + 2 * hops * lat + (gb * 2 * hops / n) / bw * 1e6
        if kind in ("all_gather", "reduce_scatter"):
            return self.base_latency + hops * lat + (gb * hops / n) / bw * 1e6
        if kind == "all_to_all":
            return self.base_latency + hops * lat + (gb * hops / n) / bw * 1e6 + self.a2a_penalty
        raise ValueError(f"unknown collective {kind!r}; expected one of {COLLECTIVES}")

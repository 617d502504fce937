"""Roofline runtime: ``launch + max(compute time, memory time)`` with efficiency factors.

compute time = flops / (peak[unit][dtype class] * compute_efficiency)
memory time  = (bytes_read + bytes_written) / (memory_bandwidth * memory_efficiency)

The launch term is a floor: no op is faster than a kernel launch / eager dispatch
(``hardware.family_launch_s`` may override it per op family, e.g. 0 for views on a GPU).
The roofline term is divided by ``hardware.family_efficiency[cost.family]`` (a
``"family:dtype class"`` entry wins; default 1):
the fraction of the roofline rate kernels of that family reach on that device.
``unit="tensor"`` costs fall back to the vector peak for dtype classes without a matrix
engine (e.g. fp32 matmul without TF32).
"""

from __future__ import annotations

import torch

from dtensor_rules.costs._util import CostError
from dtensor_rules.costs.hardware import Hardware, dtype_class, get_hardware
from dtensor_rules.costs.op_cost import OpCost

__all__ = ["runtime", "peak_flops", "family_efficiency"]


def peak_flops(hardware: Hardware, dtype: torch.dtype, unit: str = "vector") -> float:
    """Peak ops/s of ``hardware`` for ``dtype`` on ``unit``; CostError if the device cannot do it."""
    cls = dtype_class(dtype)
    if unit == "tensor":
        tcls = hardware.fp32_matmul_class if cls == "fp32" else cls
        if tcls in hardware.tensor:
            return hardware.tensor[tcls]
    if cls in hardware.vector:
        return hardware.vector[cls]
    raise CostError(
        f"hardware {hardware.name!r} has no {unit} throughput for {dtype} (class {cls!r}); "
        f"it prices {sorted(set(hardware.vector) | set(hardware.tensor))}"
    )


def runtime(cost: OpCost, hardware: Hardware | str, dtype: torch.dtype | None = None) -> float:
    """Seconds ``cost`` takes on ``hardware``; ``dtype`` defaults to ``cost.dtype`` (float32 if unknown)."""
    hw = get_hardware(hardware)
    dtype = dtype or cost.dtype or torch.float32
    compute = 0.0
    if cost.flops:
        compute = cost.flops / (peak_flops(hw, dtype, cost.unit) * hw.compute_efficiency)
    memory = cost.bytes / (hw.memory_bandwidth * hw.memory_efficiency)
    launch = hw.family_launch_s.get(cost.family, hw.launch_s)
    return launch + max(compute, memory) / family_efficiency(hw, cost.family, dtype)


def family_efficiency(hardware: Hardware, family: str, dtype: torch.dtype) -> float:
    """``hardware.family_efficiency["family:dtype class"]``, else ``["family"]``, else 1."""
    table = hardware.family_efficiency
    return table.get(f"{family}:{dtype_class(dtype)}", table.get(family, 1.0))

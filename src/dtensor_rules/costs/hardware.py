"""Hardware profiles: peak throughput per unit and dtype class, memory bandwidth, efficiencies.

Peaks are dense (no 2:4 sparsity) vendor datasheet numbers; values that no datasheet gives
are marked DERIVED with how they were obtained. Units: ops/s and bytes/s.

Dtype classes: ``fp8``, ``fp16`` (fp16 and bf16), ``tf32`` (fp32 matmul on tensor cores,
used only when a profile says so), ``fp32``, ``fp64``, ``int8``, ``int32`` (int16/32, bool,
uint8 arithmetic), ``int64``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

import torch

from dtensor_rules.costs._util import CostError

__all__ = ["Hardware", "HARDWARE", "get_hardware", "register_hardware", "dtype_class", "DTYPE_CLASSES", "FAMILIES"]

T = 1e12
DTYPE_CLASSES = ("fp8", "fp16", "tf32", "fp32", "fp64", "int8", "int32", "int64")
FAMILIES = (
    "matmul", "pointwise", "reduction", "copy", "gather", "scatter", "index", "sort", "scan", "histogram", "factory",
    "view",
)


@dataclass(frozen=True)
class Hardware:
    """One device. ``tensor`` = matrix-engine peaks, ``vector`` = ALU peaks, per dtype class.

    ``compute_efficiency`` / ``memory_efficiency`` scale the peaks to what kernels reach;
    ``launch_s`` is the fixed per-op cost (kernel launch or CPU dispatch).
    ``fp32_matmul_class`` is the class fp32 matmuls run in ("fp32", or "tf32" when allowed).
    ``family_efficiency[f]`` divides the roofline time of ops of family ``f`` (``OpCost.family``):
    the fraction of the roofline rate that family's kernels reach (e.g. random-access gathers
    vs streaming bandwidth); a key ``"f:cls"`` (e.g. ``"scan:int64"``) applies to dtype class
    ``cls`` only and wins over ``"f"``; missing families use 1. ``family_launch_s[f]`` replaces
    ``launch_s`` for family ``f`` (e.g. views launch no kernel on a GPU).
    """

    name: str
    memory_bandwidth: float
    vector: Mapping[str, float]
    tensor: Mapping[str, float] = field(default_factory=dict)
    compute_efficiency: float = 0.7
    memory_efficiency: float = 0.8
    launch_s: float = 5e-6
    fp32_matmul_class: str = "fp32"
    source: str = ""
    family_efficiency: Mapping[str, float] = field(default_factory=dict)
    family_launch_s: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.memory_bandwidth <= 0:
            raise CostError(f"hardware {self.name!r}: memory_bandwidth must be > 0 bytes/s")
        for unit in ("vector", "tensor"):
            table = getattr(self, unit)
            for k, v in table.items():
                if k not in DTYPE_CLASSES:
                    raise CostError(f"hardware {self.name!r}: unknown dtype class {k!r} in {unit}; use {DTYPE_CLASSES}")
                if v <= 0:
                    raise CostError(f"hardware {self.name!r}: {unit}[{k!r}] must be > 0 ops/s")
            object.__setattr__(self, unit, MappingProxyType(dict(table)))
        for f in ("compute_efficiency", "memory_efficiency"):
            if not 0 < getattr(self, f) <= 1:
                raise CostError(f"hardware {self.name!r}: {f} must be in (0, 1]")
        if self.launch_s < 0:
            raise CostError(f"hardware {self.name!r}: launch_s must be >= 0")
        for f, ok, what in (("family_efficiency", lambda v: v > 0, "> 0"), ("family_launch_s", lambda v: v >= 0, ">= 0")):
            table = getattr(self, f)
            for k, v in table.items():
                fam, _, cls = k.partition(":")
                if fam not in FAMILIES:
                    raise CostError(f"hardware {self.name!r}: unknown op family {fam!r} in {f}; use {FAMILIES}")
                if cls and cls not in DTYPE_CLASSES:
                    raise CostError(f"hardware {self.name!r}: unknown dtype class {cls!r} in {f}[{k!r}]; use {DTYPE_CLASSES}")
                if not ok(v):
                    raise CostError(f"hardware {self.name!r}: {f}[{k!r}] must be {what}")
            object.__setattr__(self, f, MappingProxyType(dict(table)))


def dtype_class(dtype: torch.dtype) -> str:
    """The throughput class of a dtype; raises CostError for dtypes no profile prices (complex, quantized)."""
    if dtype in (torch.float16, torch.bfloat16):
        return "fp16"
    if dtype.is_floating_point and dtype.itemsize == 1:
        return "fp8"
    if dtype == torch.float32:
        return "fp32"
    if dtype == torch.float64:
        return "fp64"
    if dtype in (torch.int8, torch.uint8):
        return "int8"
    if dtype in (torch.bool, torch.int16, torch.int32, torch.uint16, torch.uint32):
        return "int32"
    if dtype in (torch.int64, torch.uint64):
        return "int64"
    raise CostError(f"unsupported dtype {dtype} for runtime estimates: supported are float, integer and bool dtypes")


# ---------------------------------------------------------------------------------------------- profiles
# GPUs: a view only edits tensor metadata on the host, no kernel is launched.
_GPU_LAUNCH = {"view": 0.0}
# H100 SXM5 80GB: NVIDIA H100 Tensor Core GPU datasheet (2023), SXM column, dense:
#   FP64 34 TF, FP64 TC 67 TF, FP32 67 TF, TF32 TC 494.5 TF, BF16/FP16 TC 989.5 TF,
#   FP8 TC 1979 TF, INT8 TC 1979 TOPS, HBM3 3.35 TB/s.
# DERIVED int32 vector: Hopper SM has 64 INT32 lanes (H100 architecture whitepaper), 1 op per
#   lane per clock: 132 SMs x 64 x 1.98 GHz = 16.7 TOPS (= FP32/4, FP32 counting an FMA as 2).
#   int64 has no native ALU path (emulated with int32 pairs): int32/4. fp16 vector: packed
#   half2 = 2 x FP32.
_H100_TENSOR = {"fp64": 67 * T, "tf32": 494.5 * T, "fp16": 989.5 * T, "fp8": 1979 * T, "int8": 1979 * T}
_H100_VECTOR = {"fp64": 34 * T, "fp32": 67 * T, "fp16": 134 * T, "int32": 16.7 * T, "int64": 4.2 * T, "int8": 16.7 * T}

H100 = Hardware(
    "h100", 3.35e12, _H100_VECTOR, _H100_TENSOR, launch_s=4e-6, family_launch_s=_GPU_LAUNCH,
    source="NVIDIA H100 Tensor Core GPU datasheet (SXM5, dense); int vector rates derived from the Hopper whitepaper",
)
# H200 SXM 141GB: NVIDIA H200 Tensor Core GPU datasheet (2024): same compute as H100 SXM,
#   HBM3e 4.8 TB/s.
H200 = Hardware(
    "h200", 4.8e12, _H100_VECTOR, _H100_TENSOR, launch_s=4e-6, family_launch_s=_GPU_LAUNCH,
    source="NVIDIA H200 Tensor Core GPU datasheet (SXM, dense); compute as H100 SXM",
)
# A100 SXM4 80GB: NVIDIA A100 Tensor Core GPU datasheet (2021), dense:
#   FP64 9.7 TF, FP64 TC 19.5 TF, FP32 19.5 TF, TF32 TC 156 TF, BF16/FP16 TC 312 TF,
#   INT8 TC 624 TOPS, HBM2e 2,039 GB/s. No FP8.
# DERIVED int32 vector: Ampere SM has 64 INT32 lanes, 1 op per lane per clock:
#   108 SMs x 64 x 1.41 GHz = 9.75 TOPS; int64 = int32/4; fp16 vector = 4 x FP32 (A100 whitepaper: 78 TF).
A100 = Hardware(
    "a100", 2.039e12,
    {"fp64": 9.7 * T, "fp32": 19.5 * T, "fp16": 78 * T, "int32": 9.75 * T, "int64": 2.4 * T, "int8": 9.75 * T},
    {"fp64": 19.5 * T, "tf32": 156 * T, "fp16": 312 * T, "int8": 624 * T},
    launch_s=5e-6, family_launch_s=_GPU_LAUNCH,
    source="NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB, dense); fp16/int vector rates derived (Ampere whitepaper)",
)
# B200: NVIDIA HGX B200 / DGX B200 datasheet (2024), per GPU, dense = half the sparse figures:
#   FP8 TC 4.5 PF, INT8 TC 4.5 POPS, FP16/BF16 TC 2.25 PF, TF32 TC 1.1 PF, FP64/FP64 TC 40 TF,
#   HBM3e 8 TB/s.
# DERIVED fp32 vector 80 TF (2 x FP64, as on Hopper); int32 = FP32/4 (as on Hopper); int64 = int32/4.
B200 = Hardware(
    "b200", 8.0e12,
    {"fp64": 40 * T, "fp32": 80 * T, "fp16": 160 * T, "int32": 20 * T, "int64": 5 * T, "int8": 20 * T},
    {"fp64": 40 * T, "tf32": 1100 * T, "fp16": 2250 * T, "fp8": 4500 * T, "int8": 4500 * T},
    launch_s=4e-6, family_launch_s=_GPU_LAUNCH,
    source="NVIDIA HGX B200 datasheet (per GPU, dense = sparse/2); vector rates derived",
)
# CPU: MEASURED on the project's 2-core dev box (AMD EPYC, AVX-512, 2 MB L2/core, 32 MB L3),
#   torch 2.13.0+cpu, 1 intra-op thread, process CPU time, by
#   `benchmarks/cost_model_accuracy.py --print-profile` (one of three runs, the middle bandwidth).
#   It is one core of one machine: calibrate your own (`--print-profile`) and register it.
#   - memory_bandwidth: a 64 MB copy (DRAM streaming); launch_s: a 1-element add.
#   - vector: cache-resident adds per dtype; int64 from a sum (torch's int64 add computes
#     a + alpha*b with a 64-bit multiply: 1.5 G/s, a multiply rate). tensor: a 256^3 mm.
#   - family_efficiency[f] = model roofline time / measured time of a 2**18-element (1 MB fp32)
#     1-d call of the family (add, sum, clone, gather, scatter_add, index of 64-float rows, sort,
#     cumsum fp32 and int64, histc). Values > 1 (pointwise 4.4, copy 3.0, reduction 3.1) mean the
#     L2/L3-resident call runs faster than DRAM streaming; values < 1 are kernels far below the
#     roofline: element-granular gather 0.2 (~2 ns per element), sort 0.022 (a comparison-and-move
#     costs ~45 adds), fp32 cumsum 0.32 (one dependent add per element, latency bound),
#     histc 0.09 (binning arithmetic), row index 0.43.
#   - family_launch_s[f]: a 16-element call of the same op (per-op dispatch floor).
CPU = Hardware(
    "cpu", 26e9,
    {"fp32": 9.9e9, "fp64": 4.8e9, "fp16": 5.4e9, "int32": 9.7e9, "int8": 37e9, "int64": 10e9},
    {"fp32": 99e9, "fp16": 196e9},
    compute_efficiency=1.0, memory_efficiency=1.0, launch_s=1.2e-6,
    family_efficiency={
        "pointwise": 4.4, "reduction": 3.1, "copy": 3.0, "gather": 0.2, "scatter": 0.88, "index": 0.43,
        "sort": 0.022, "scan": 0.32, "scan:int64": 1.6, "histogram": 0.09,
    },
    family_launch_s={
        "pointwise": 1.9e-6, "reduction": 2.0e-6, "copy": 1.9e-6, "gather": 2.0e-6, "scatter": 2.7e-6,
        "index": 3.6e-6, "sort": 4.5e-6, "scan": 2.2e-6, "histogram": 5.5e-6, "factory": 2.5e-6, "view": 2.2e-6,
    },
    source="measured on the 2-core dev box, 1 thread (benchmarks/cost_model_accuracy.py); calibrate your own",
)

_PROFILES: dict[str, Hardware] = {h.name: h for h in (H100, H200, A100, B200, CPU)}
_ALIASES = {"h100-sxm": "h100", "h200-sxm": "h200", "a100-sxm": "a100", "cpu-generic": "cpu"}
HARDWARE = MappingProxyType(_PROFILES)


def get_hardware(name: str | Hardware) -> Hardware:
    """A profile by name (case-insensitive) or the Hardware itself."""
    if isinstance(name, Hardware):
        return name
    key = str(name).lower()
    key = _ALIASES.get(key, key)
    if key not in _PROFILES:
        raise CostError(
            f"unknown hardware {name!r}: known profiles are {sorted(_PROFILES)}; "
            "define your own with register_hardware(Hardware(name=..., memory_bandwidth=..., vector={...}))"
        )
    return _PROFILES[key]


def register_hardware(hw: Hardware, *, replace: bool = False) -> Hardware:
    """Add a user-defined profile, retrievable by ``get_hardware(hw.name)``."""
    if not isinstance(hw, Hardware):
        raise CostError(f"register_hardware expects a Hardware, got {hw!r}")
    key = hw.name.lower()
    if (key in _PROFILES or key in _ALIASES) and not replace:
        raise CostError(f"hardware profile {hw.name!r} exists; pass replace=True to replace it")
    _PROFILES[key] = hw
    return hw

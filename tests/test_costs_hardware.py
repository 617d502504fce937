"""Hardware profiles and the roofline runtime."""

from __future__ import annotations

import pytest
import torch

from dtensor_rules.costs import CostError, Hardware, OpCost, get_hardware, register_hardware, runtime
from dtensor_rules.costs.hardware import _PROFILES

TOY = Hardware(
    "toy", memory_bandwidth=100.0, vector={"fp32": 10.0, "int64": 5.0}, tensor={"fp16": 1000.0},
    compute_efficiency=0.5, memory_efficiency=0.5, launch_s=1.0,
)


def test_memory_bound_time() -> None:
    # 200 bytes at 100 B/s * 0.5 = 4 s; 10 flops at 10 * 0.5 = 2 s -> 1 + 4
    assert runtime(OpCost(10, 150, 50, dtype=torch.float32), TOY) == pytest.approx(5.0)


def test_compute_bound_time_uses_dtype_class_and_unit() -> None:
    assert runtime(OpCost(100, 0, 0, dtype=torch.int64), TOY) == pytest.approx(1 + 100 / 2.5)
    assert runtime(OpCost(1000, 0, 0, dtype=torch.bfloat16, unit="tensor"), TOY) == pytest.approx(1 + 2.0)
    # fp32 has no tensor-unit entry: falls back to the vector peak
    assert runtime(OpCost(10, 0, 0, dtype=torch.float32, unit="tensor"), TOY) == pytest.approx(1 + 2.0)


def test_explicit_dtype_overrides_cost_dtype() -> None:
    assert runtime(OpCost(10, 0, 0, dtype=torch.int64), TOY, torch.float32) == pytest.approx(3.0)


def test_launch_floor() -> None:
    assert runtime(OpCost(0, 0, 0), TOY) == 1.0


def test_named_profiles_and_their_ordering() -> None:
    h100, h200, a100, b200 = (get_hardware(n) for n in ("H100", "h200", "a100", "B200"))
    get_hardware("cpu")
    assert h200.memory_bandwidth > h100.memory_bandwidth > a100.memory_bandwidth
    assert b200.tensor["fp16"] > h100.tensor["fp16"] > a100.tensor["fp16"]
    big = OpCost(10**12, 10**9, 10**9, dtype=torch.bfloat16, unit="tensor")
    assert runtime(big, "b200") < runtime(big, "h100") < runtime(big, "a100")


def test_unknown_hardware_name() -> None:
    with pytest.raises(CostError, match=r"unknown hardware 'h300'.*known profiles.*register_hardware"):
        get_hardware("h300")


def test_unsupported_dtype() -> None:
    with pytest.raises(CostError, match="unsupported dtype torch.complex64"):
        runtime(OpCost(1, 1, 1, dtype=torch.complex64), "h100")
    with pytest.raises(CostError, match="'a100' has no tensor throughput for torch.float8_e4m3fn"):
        runtime(OpCost(1, 1, 1, dtype=torch.float8_e4m3fn, unit="tensor"), "a100")


def test_user_profile_registration() -> None:
    try:
        register_hardware(TOY)
        assert get_hardware("TOY") is TOY
        with pytest.raises(CostError, match="exists"):
            register_hardware(TOY)
    finally:
        _PROFILES.pop("toy", None)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"memory_bandwidth": 0.0}, "memory_bandwidth"),
        ({"vector": {"fp33": 1.0}}, "unknown dtype class"),
        ({"vector": {"fp32": -1.0}}, "must be > 0"),
        ({"compute_efficiency": 1.5}, "compute_efficiency"),
    ],
)
def test_malformed_profile(kwargs: dict, match: str) -> None:
    base = {"name": "bad", "memory_bandwidth": 1.0, "vector": {"fp32": 1.0}}
    with pytest.raises(CostError, match=match):
        Hardware(**{**base, **kwargs})


def test_family_efficiency_and_launch_override() -> None:
    from dataclasses import replace

    hw = replace(TOY, name="toy-fam", family_efficiency={"gather": 0.25}, family_launch_s={"view": 0.0})
    # 200 bytes: 4 s roofline, a gather reaches a quarter of it -> 16 s
    assert runtime(OpCost(0, 150, 50, dtype=torch.float32, family="gather"), hw) == pytest.approx(1 + 16.0)
    assert runtime(OpCost(0, 150, 50, dtype=torch.float32, family="copy"), hw) == pytest.approx(1 + 4.0)
    assert runtime(OpCost(0, 0, 0, family="view"), hw) == 0.0
    assert runtime(OpCost(0, 0, 0, family="view"), "h100") == 0.0  # no kernel on a GPU


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"family_efficiency": {"gathr": 0.5}}, "unknown op family 'gathr'"),
        ({"family_efficiency": {"gather": 0.0}}, r"family_efficiency\['gather'\] must be > 0"),
        ({"family_launch_s": {"view": -1.0}}, r"family_launch_s\['view'\] must be >= 0"),
    ],
)
def test_bad_family_tables_are_rejected(kw, match) -> None:
    with pytest.raises(CostError, match=match):
        Hardware("bad", memory_bandwidth=1.0, vector={"fp32": 1.0}, **kw)


def test_family_efficiency_per_dtype_class_wins_over_family() -> None:
    from dataclasses import replace

    from dtensor_rules.costs.runtime import family_efficiency

    hw = replace(TOY, name="toy-scan", family_efficiency={"scan": 0.5, "scan:int64": 2.0})
    assert family_efficiency(hw, "scan", torch.int64) == 2.0
    assert family_efficiency(hw, "scan", torch.float32) == 0.5
    assert family_efficiency(hw, "copy", torch.float32) == 1.0
    # 100 int64 ops at 5 * 0.5 = 2.5/s -> 40 s, twice as fast for int64 scans
    assert runtime(OpCost(100, 0, 0, dtype=torch.int64, family="scan"), hw) == pytest.approx(1 + 20.0)
    with pytest.raises(CostError, match="unknown dtype class 'int65'"):
        Hardware("bad", memory_bandwidth=1.0, vector={"fp32": 1.0}, family_efficiency={"scan:int65": 1.0})


"""``partial_survives_cast``: whenever it says yes, reducing then casting equals casting then
reducing, for adversarial parts (cancelling floats, near-wraparound ints). Oracle: plain torch."""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import assume, given, strategies as st

from dtensor_rules.op_rules._partial import partial_survives_cast
from tests._examples import scaled

DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool]
REDUCE = {"sum": torch.add, "max": torch.maximum, "min": torch.minimum}


def _reduce(op: str, parts: list[torch.Tensor]) -> torch.Tensor:
    if op == "avg":
        return functools.reduce(torch.add, parts) / len(parts)
    return functools.reduce(REDUCE[op], parts)  # stays in the parts' dtype (torch.sum would widen ints)


def _adversarial(dtype: torch.dtype, n: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return [torch.randint(0, 2, (8,), generator=g).bool() for _ in range(n)]
    if dtype.is_floating_point:
        big = torch.tensor([70000.0, 1.0, 1.0, 3e38, 1e-8, 0.1, -2.5, 65504.0], dtype=torch.float64)
        parts = [big * (1 if r % 2 == 0 else -1) + torch.randn(8, generator=g, dtype=torch.float64) for r in range(n)]
        return [p.to(dtype) for p in parts]
    info = torch.iinfo(dtype)
    near = torch.tensor([info.max, info.max - 1, info.min, info.min + 1, 0, 1, info.max // 2 + 1, -1 if info.min < 0 else 2])
    return [(near - r) .clamp(info.min, info.max).to(dtype) for r in range(n)]


@scaled(10)  # a predicate over 4 ops x every dtype pair, ~1 ms an example: ten times the profile's count
@given(st.sampled_from(["sum", "avg", "max", "min"]), st.sampled_from(DTYPES), st.sampled_from(DTYPES), st.integers(2, 4), st.integers(0, 9))
def test_yes_means_commutes(reduce_op: str, src: torch.dtype, dst: torch.dtype, n: int, seed: int) -> None:
    assume(partial_survives_cast(reduce_op, src, dst))  # a refused cast claims nothing
    parts = _adversarial(src, n, seed)
    want = _reduce(reduce_op, parts).to(dst)
    got = _reduce(reduce_op, [p.to(dst) for p in parts])
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize(
    "src,dst",
    [(torch.float32, torch.float16), (torch.float32, torch.bfloat16), (torch.float32, torch.float64), (torch.bfloat16, torch.float32),
     (torch.int32, torch.int64), (torch.int64, torch.float32), (torch.float32, torch.int64), (torch.int64, torch.int32)],
)
def test_sum_refused_for_every_non_identity_cast(src: torch.dtype, dst: torch.dtype) -> None:
    assert not partial_survives_cast("sum", src, dst)
    assert not partial_survives_cast("avg", src, dst)


def test_a_sum_partial_that_overflows_fp16_is_not_carried_through_the_cast() -> None:
    parts = [torch.tensor([70000.0, 1, 1]), torch.tensor([-70000.0, -1, 0])]
    assert torch.isnan(_reduce("sum", [p.half() for p in parts])).any()  # what carrying the Partial gives
    assert not partial_survives_cast("sum", torch.float32, torch.float16)


def test_monotone_casts_keep_max_min() -> None:
    assert partial_survives_cast("max", torch.int32, torch.int64)
    assert partial_survives_cast("min", torch.int64, torch.float16)
    assert partial_survives_cast("max", torch.float32, torch.bfloat16)
    assert not partial_survives_cast("max", torch.int64, torch.int32)  # wraps
    assert not partial_survives_cast("max", torch.int8, torch.uint8)  # -1 -> 255
    assert not partial_survives_cast("max", torch.float32, torch.int32)  # NaN / out of range
    assert not partial_survives_cast("sum", torch.bool, torch.bool)
    assert not partial_survives_cast("avg", torch.int64, torch.int64)

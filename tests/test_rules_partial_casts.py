"""Partial through dtype casts: a Partial row is emitted only where the op's cast of
that operand is additive (sum/avg) or monotone (max/min), for fma (type promotion), softmax
backward (``input_dtype``) and grouped mm (``out_dtype``).

Oracle: plain torch. A Partial value is the reduction of its parts *in its own dtype* (what
DTensor's all-reduce computes); the strategy is valid iff reducing the per-rank outputs (in the
output dtype) gives the op applied to that value. Parts are adversarial: integers drawn over the
whole range (their sum wraps), floats that cancel at large magnitude.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.distributed.tensor import Partial

import dtensor_rules  # noqa: F401
from dtensor_rules._upstream import TensorMeta
from dtensor_rules.op_rules._partial import partial_survives_cast
from dtensor_rules.op_rules.fma import fma, fma_rows
from dtensor_rules.op_rules.grouped_mm import GROUPED_MM
from dtensor_rules.op_rules.softmax import SOFTMAX_BACKWARD, softmax_backward_strategy
from dtensor_rules.testing.tables import strategy_table
from tests._examples import scaled

DTYPES = [torch.bool, torch.int8, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32]

# (reduction, source dtype, cast dtype) where partial_survives_cast allows a Partial through the cast:
# the cases the property below checks (drawn from directly, so no example is spent on a refused cast)
COMMUTING_CASTS = [(op, src, dst) for op in ("sum", "avg", "max", "min") for src in DTYPES for dst in DTYPES
                   if partial_survives_cast(op, src, dst)]


def _reduce(parts: list[torch.Tensor], op: str) -> torch.Tensor:
    out = parts[0]
    for p in parts[1:]:
        out = {"sum": torch.add, "avg": torch.add, "max": torch.maximum, "min": torch.minimum}[op](out, p)
    return out / len(parts) if op == "avg" else out


def _parts(draw: st.DrawFn, dtype: torch.dtype, shape: tuple[int, ...], n: int = 2) -> list[torch.Tensor]:
    """n adversarial parts: integers over the whole range, floats cancelling at large magnitude."""
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    if not dtype.is_floating_point:
        info = torch.iinfo(dtype)
        return [torch.randint(info.min, info.max, shape, generator=g, dtype=torch.int64).to(dtype) for _ in range(n)]
    big = draw(st.sampled_from([1.0, 1e2, 1e3 if dtype == torch.float16 else 1e6]))
    first = [torch.randn(shape, generator=g) * big for _ in range(n - 1)]
    last = torch.randn(shape, generator=g) - sum(first)  # cancels the others: the value is O(1)
    return [p.to(dtype) for p in first + [last]]


def _close(got: torch.Tensor, want: torch.Tensor, scale: torch.Tensor, parts_may_overflow: bool = False) -> None:
    """Exact for integers; for floats, rounding allowed relative to the local outputs' magnitude."""
    if not want.dtype.is_floating_point:
        assert torch.equal(got, want), (got, want)
        return
    eps = torch.finfo(want.dtype).eps
    tol = 64 * eps * scale.double() + 8 * eps * want.double().abs() + 1e-6
    g, w = got.double(), want.double()
    ok = (g == w) | ((g - w).abs() <= tol) | (g.isnan() & w.isnan())  # equal infinities count as equal
    # a part that overflows its own dtype (fp16 parts of 1e3 times 127) is Partial arithmetic itself:
    # DTensor's mul of a Partial by a replicated tensor does the same; casts are what the rules must guard
    if parts_may_overflow:
        ok |= scale.double() > torch.finfo(want.dtype).max
    assert bool(ok.all()), (got, want)


# ---------------------------------------------------------------------------------- the predicate itself
@scaled(5)  # plain-tensor arithmetic over a dtype product, ~ms an example: five times the profile's count
@given(case=st.sampled_from(COMMUTING_CASTS), data=st.data())
def test_predicate_true_means_the_cast_commutes_with_the_reduction(case: tuple[str, torch.dtype, torch.dtype], data) -> None:  # noqa: ANN001
    op, src, dst = case
    parts = _parts(data.draw, src, (16,))
    want = _reduce(parts, op).to(dst)
    got = _reduce([p.to(dst) for p in parts], op)
    if op == "avg" and src == dst:
        _close(got, want, sum(p.abs().to(dst) for p in parts))
    else:
        _close(got, want, torch.zeros_like(want))


@pytest.mark.parametrize(
    "op, src, dst, parts",
    [
        ("sum", torch.int8, torch.int64, [100, 100]),  # wraps in int8, not in int64
        ("sum", torch.float16, torch.float32, [60000.0, 60000.0]),  # inf in float16, finite in float32
        ("sum", torch.float32, torch.float16, [1e6, -1e6 + 1]),  # each part overflows float16: inf - inf
        ("max", torch.int64, torch.int8, [1, 255]),  # narrowing wraps 255 to -1
        ("max", torch.float32, torch.int32, [float("nan"), 1.0]),
    ],
)
def test_predicate_false_cases_have_counterexamples(op, src, dst, parts) -> None:  # noqa: ANN001
    assert not partial_survives_cast(op, src, dst)
    ts = [torch.tensor([p]).to(src) for p in parts]
    want, got = _reduce(ts, op).to(dst), _reduce([t.to(dst) for t in ts], op)
    assert not torch.equal(want, got)


# ---------------------------------------------------------------------------------- fma (type promotion)
def _meta(t: torch.Tensor) -> TensorMeta:
    return TensorMeta(t.shape, t.stride(), t.dtype)


def _rand(dtype: torch.dtype, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if not dtype.is_floating_point:
        return torch.randint(-50, 50, shape, generator=g).to(dtype)
    return torch.randn(shape, generator=g).to(dtype)
@scaled(5)  # plain-tensor arithmetic over a dtype product, ~ms an example: five times the profile's count
@given(da=st.sampled_from(DTYPES), db=st.sampled_from(DTYPES), dc=st.sampled_from(DTYPES), data=st.data())
def test_every_fma_partial_row_is_valid_for_its_dtypes(da, db, dc, data) -> None:  # noqa: ANN001
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    shape = (6,)
    a, b, c = _rand(da, shape, g), _rand(db, shape, g), _rand(dc, shape, g)
    out_dtype = fma(a, b, c).dtype
    for row in fma_rows(_meta(a), _meta(b), _meta(c)):
        out_p, ins = row[0], row[1:]
        if not isinstance(out_p, Partial):
            continue
        op = out_p.reduce_op
        assert op != "avg" or out_dtype.is_floating_point
        per_rank = [[t, t] for t in (a, b, c)]  # replicated operands: the same on both ranks
        for i, p in enumerate(ins):
            if isinstance(p, Partial):
                per_rank[i] = _parts(data.draw, (a, b, c)[i].dtype, shape)
        values = [_reduce(parts, op) if isinstance(p, Partial) else parts[0] for p, parts in zip(ins, per_rank)]
        want = fma(*[v.to(t.dtype) for v, t in zip(values, (a, b, c))])
        locals_ = [fma(*[per_rank[i][r] for i in range(3)]) for r in range(2)]
        got = _reduce(locals_, op)
        # rounding is relative to the magnitudes each rank computed with: |a*b| + |c| (not the
        # local result, which cancels when c's part offsets a*b's)
        scale = sum(per_rank[0][r].double().abs() * per_rank[1][r].double().abs() + per_rank[2][r].double().abs()
                    for r in range(2))
        _close(got, want.to(got.dtype), scale if out_dtype.is_floating_point else got, parts_may_overflow=True)


def test_fma_offers_no_partial_sum_through_a_widening_promotion() -> None:
    """int8 a with int64 b: P(sum) a would not wrap like the int8 sum does; float16 with float32 likewise."""
    for low, high in ((torch.int8, torch.int64), (torch.float16, torch.float32), (torch.bfloat16, torch.float32)):
        a, b = torch.ones(4, dtype=low), torch.ones(4, dtype=high)
        rows = fma_rows(_meta(a), _meta(b), _meta(b))
        assert not any(isinstance(r[1], Partial) for r in rows), rows
    table = strategy_table(fma, (torch.ones(4, dtype=torch.int32),) * 3, mesh_shape=(2,))
    assert "P(avg)" not in table and "P(max)" not in table and "P(sum)" in table  # integers: sum only


# ---------------------------------------------------------------------------------- softmax backward
@pytest.mark.parametrize("g_dtype, input_dtype", list(itertools.product([torch.float32, torch.bfloat16, torch.float16],
                                                                          [torch.float32, torch.bfloat16, torch.float16])))
def test_softmax_backward_partial_rows_only_without_a_cast(g_dtype, input_dtype) -> None:  # noqa: ANN001
    g = torch.empty(4, 6, dtype=g_dtype)
    rows = softmax_backward_strategy(SOFTMAX_BACKWARD[0], (_meta(g), _meta(g), 1, input_dtype), {})
    has_partial = any(isinstance(r[1], Partial) for r in rows)
    assert has_partial == (g_dtype == input_dtype)
@given(dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]), op=st.sampled_from(["sum", "avg"]),
       data=st.data())
def test_softmax_backward_partial_grad_with_cancelling_parts(dtype, op, data) -> None:  # noqa: ANN001
    sbd = SOFTMAX_BACKWARD[0]
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    y = torch.randn(3, 5, generator=gen).softmax(1).to(dtype)
    parts = _parts(data.draw, dtype, (3, 5))
    want = sbd(_reduce(parts, op), y, 1, dtype)
    locals_ = [sbd(p, y, 1, dtype) for p in parts]
    # rounding scale: y * (|g| + the row sum of |g * y|), per part (a local output can be small while its row sum is not)
    yf = y.float().abs()
    scale = sum(yf * (p.float().abs() + (p.float().abs() * yf).sum(1, keepdim=True)) for p in parts)
    _close(_reduce(locals_, op), want, scale.to(dtype))


# ---------------------------------------------------------------------------------- grouped mm out_dtype
def test_grouped_mm_partial_rows_need_the_operand_dtype() -> None:
    a, b = torch.randn(2, 4, 16).bfloat16(), torch.randn(2, 16, 8).bfloat16()
    assert "P(sum)" in strategy_table(GROUPED_MM, (a, b))
    with pytest.raises(RuntimeError):  # the CPU kernel: out_dtype must match; no Partial row is offered either
        GROUPED_MM(a, b, out_dtype=torch.float32)
@given(dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]), op=st.sampled_from(["sum", "avg"]),
       data=st.data())
def test_grouped_mm_partial_a_with_cancelling_parts(dtype, op, data) -> None:  # noqa: ANN001
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    b = torch.randn(2, 16, 8, generator=gen).to(dtype)
    offs = torch.tensor([2, 5], dtype=torch.int32)
    parts = _parts(data.draw, dtype, (5, 16))
    want = GROUPED_MM(_reduce(parts, op), b, offs)
    locals_ = [GROUPED_MM(p, b, offs) for p in parts]
    scale = sum(GROUPED_MM(p.abs(), b.abs(), offs) for p in parts)
    _close(_reduce(locals_, op), want, 4 * scale)

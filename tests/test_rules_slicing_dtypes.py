"""cat / slice_scatter with a dtype change: Partial passes only where the cast keeps the reduction.

The oracle is plain torch on each DTensor's full value (its parts reduced in ITS dtype, as
``full_tensor()`` does), with per-rank parts chosen adversarially: cancelling large values
(fp16 narrowing gives inf - inf = NaN), values near the integer wraparound (int32 parts
2**31-1 and 1 wrap single-device, not after widening), 2**24 + 1 (int -> float rounds each
part), fp16 parts whose fp16 sum overflows.
"""

from __future__ import annotations

import functools

import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

import dtensor_rules  # noqa: F401  (installs the rules)
from dtensor_rules._upstream import LocalTensor
from dtensor_rules.op_rules._casts import cast_partial_ops, monotone_cast
from dtensor_rules.testing import check_rule, simulated_mesh
from dtensor_rules.testing.dispatch import full_value, to_dtensor
from dtensor_rules.testing.tables import emitted

aten = torch.ops.aten
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.int32, torch.int64,
          torch.uint8, torch.bool)
POOL = (70000.0, -70000.0, 60000.0, 1.0, -1.0, 0.0, 2**31 - 1, -(2**31), 16777217, 2**62, 0.5, 3.0e38)


def test_cast_table() -> None:
    same = ("sum", "avg", "max", "min")
    assert cast_partial_ops(torch.float32, torch.float32) == same
    assert cast_partial_ops(torch.int32, torch.int32) == ("sum", "max", "min")
    assert cast_partial_ops(torch.float32, torch.float16) == ("max", "min")  # narrowing: monotone only
    assert cast_partial_ops(torch.float16, torch.float32) == ("max", "min")  # widening loses the fp16 overflow
    assert cast_partial_ops(torch.int32, torch.int64) == ("max", "min")  # widening loses the wraparound
    assert cast_partial_ops(torch.int64, torch.float32) == ("max", "min")  # rounds each part
    assert cast_partial_ops(torch.float32, torch.int64) == ()  # truncation; out of range is undefined
    assert cast_partial_ops(torch.int64, torch.int32) == ()  # narrowing wraps: not monotone
    assert cast_partial_ops(torch.int8, torch.uint8) == ()  # -1 -> 255
    assert cast_partial_ops(torch.bool, torch.int64) == () == cast_partial_ops(torch.int64, torch.bool)
    assert monotone_cast(torch.uint8, torch.int16) and not monotone_cast(torch.uint8, torch.int8)


def _value(v: float, dtype: torch.dtype) -> float | int | bool:
    if dtype == torch.bool:
        return bool(v)
    if dtype.is_floating_point:
        return v
    info = torch.iinfo(dtype)
    return int(min(max(v, info.min), info.max))


@st.composite
def parts(draw, dtype: torch.dtype, shape: tuple[int, ...], reduce_op: str | None):  # noqa: ANN001, ANN201
    """Two per-rank parts of one DTensor (equal when it is Replicate)."""
    pool = POOL if reduce_op != "avg" else tuple(v for v in POOL if abs(v) < 1e4)  # avg of R copies sums first
    n = 1
    for s in shape:
        n *= s
    out = []
    for _ in range(2 if reduce_op else 1):
        vals = [_value(draw(st.sampled_from(pool)), dtype) for _ in range(n)]
        out.append(torch.tensor(vals, dtype=dtype).reshape(shape))
    return out if reduce_op else out * 2


def _dtensor(ps: list[torch.Tensor], mesh, reduce_op: str | None) -> DTensor:  # noqa: ANN001
    pl = (Partial(reduce_op),) if reduce_op else (Replicate(),)
    return DTensor.from_local(LocalTensor({0: ps[0], 1: ps[1]}), mesh, pl, run_check=False,
                              shape=ps[0].shape, stride=ps[0].stride())


def _layout(draw, dtype: torch.dtype) -> str | None:  # noqa: ANN001
    ops = [None] + ([] if dtype == torch.bool else ["sum", "max", "min"] + (["avg"] if dtype.is_floating_point else []))
    return draw(st.sampled_from(ops))


def _avg_in_range(ps: list[torch.Tensor], reduce_op: str | None, *, joins_avg: bool = False) -> bool:
    """Partial(avg) parts whose sum cannot overflow: DTensor reduces avg by summing then dividing on
    some paths and dividing first on others, so near the top of a float's range (fp16 60000 + 60000)
    the two reductions differ by inf. That is DTensor's reduction, not a layout the rule chose.

    ``joins_avg``: another input of a call that has a Partial(avg) input. Its full value can join
    the avg sum (reduced to R if it is Partial, then R -> P(avg), which is free, so the output stays
    P(avg)), and upstream's own rules do the same: ``R(fp16 60000) + P(avg)``, ``*``, ``-`` and
    ``cat`` all give inf with the package uninstalled (torch 2.13 and 2.14.1). Its full value must
    be in range too."""
    limit = torch.finfo(ps[0].dtype).max / len(ps) if ps[0].dtype.is_floating_point else None
    if reduce_op != "avg":
        if not joins_avg or limit is None:
            return True
        wide = [p.double() for p in ps]
        full = {None: wide[0], "sum": sum(wide), "max": torch.stack(wide).amax(0), "min": torch.stack(wide).amin(0)}[reduce_op]
        return bool(torch.isfinite(full).all()) and float(full.abs().max()) < limit
    return all(bool(torch.isfinite(p).all()) and float(p.abs().max()) < limit for p in ps)


def _same(got: torch.Tensor, want: torch.Tensor, avg: bool) -> None:
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    if avg:
        torch.testing.assert_close(got, want, equal_nan=True)
    else:
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


@given(st.data())
def test_slice_scatter_partial_src_of_another_dtype(data) -> None:  # noqa: ANN001
    self_dtype, src_dtype = data.draw(st.sampled_from(DTYPES)), data.draw(st.sampled_from(DTYPES))
    full = data.draw(st.booleans())  # full slice: out == cast(src), the src-passing rows apply
    start, end = (0, None) if full else (1, 3)
    self_op, src_op = _layout(data.draw, self_dtype), _layout(data.draw, src_dtype)
    self_parts = data.draw(parts(self_dtype, (2, 4), self_op))
    src_parts = data.draw(parts(src_dtype, (2, 4 if full else 2), src_op))
    avg = "avg" in (self_op, src_op)
    assume(_avg_in_range(self_parts, self_op, joins_avg=avg) and _avg_in_range(src_parts, src_op, joins_avg=avg))
    with simulated_mesh((2,)) as mesh:
        x, src = _dtensor(self_parts, mesh, self_op), _dtensor(src_parts, mesh, src_op)
        want = aten.slice_scatter.default(full_value(x), full_value(src), 1, start, end)
        got = full_value(aten.slice_scatter.default(x, src, 1, start, end))
    _same(got, want, "avg" in (self_op, src_op))


@given(st.data())
def test_cat_partial_inputs_of_mixed_dtypes(data) -> None:  # noqa: ANN001
    dtypes = [data.draw(st.sampled_from(DTYPES)) for _ in range(data.draw(st.integers(2, 3)))]
    ops = [_layout(data.draw, d) for d in dtypes]
    all_parts = [data.draw(parts(d, (2, 3), o)) for d, o in zip(dtypes, ops)]
    out_dtype = functools.reduce(torch.promote_types, dtypes)
    # every input joins the avg sum in the result's dtype (an integer one after its cast)
    assume(all(_avg_in_range([p.to(out_dtype) for p in ps], o, joins_avg="avg" in ops) for ps, o in zip(all_parts, ops)))
    with simulated_mesh((2,)) as mesh:
        xs = [_dtensor(ps, mesh, o) for ps, o in zip(all_parts, ops)]
        want = torch.cat([full_value(x) for x in xs], 1)
        got = full_value(torch.cat(xs, 1))
    _same(got, want, "avg" in ops)


def test_cat_int_partial_sum_with_int_replicate_stays_int() -> None:
    """Upstream turns the Replicate operand into Partial(sum) by dividing it (float32)."""
    a, b = torch.tensor([[5, -3]]), torch.tensor([[7, 9]])
    with simulated_mesh((2,)) as mesh:
        pa = _dtensor([a, torch.tensor([[2, 2]])], mesh, "sum")
        out = torch.cat([pa, _dtensor([b, b], mesh, None)], 0)
        assert out.dtype == torch.int64
        _same(full_value(out), torch.cat([a + 2, b], 0), avg=False)


def test_cat_fp16_partial_sum_with_wider_dtype_keeps_the_overflow() -> None:
    big = torch.full((1, 2), 60000.0, dtype=torch.float16)
    with simulated_mesh((2,)) as mesh:
        p = _dtensor([big, big], mesh, "sum")  # its value is inf in fp16
        out = full_value(torch.cat([p, _dtensor([torch.ones(1, 2)] * 2, mesh, None)], 0))
    assert out.dtype == torch.float32 and torch.isinf(out[0]).all()


def test_cat_int32_partial_sum_with_int64_keeps_the_wraparound() -> None:
    hi, one = torch.full((1, 2), 2**31 - 1, dtype=torch.int32), torch.ones(1, 2, dtype=torch.int32)
    with simulated_mesh((2,)) as mesh:
        p = _dtensor([hi, one], mesh, "sum")
        out = full_value(torch.cat([p, _dtensor([torch.zeros(1, 2, dtype=torch.int64)] * 2, mesh, None)], 0))
    assert out.dtype == torch.int64 and (out[0] == -(2**31)).all()


def test_no_partial_sum_row_through_a_cast() -> None:
    """The emitted strategies themselves: no P(sum)/P(avg) input of another dtype than the output."""
    for self_dtype, src_dtype in ((torch.float16, torch.float32), (torch.int64, torch.int32), (torch.float32, torch.int64)):
        x, src = torch.zeros(4, 6, dtype=self_dtype), torch.zeros(4, 6, dtype=src_dtype)
        for ins, outs in emitted(aten.slice_scatter.default, (x, src, 1, 0, None), {}, (2,)):
            assert ins[1][0] not in (Partial("sum"), Partial("avg")), (ins, outs)
        out_dtype = torch.promote_types(self_dtype, src_dtype)
        cast = [i for i, t in enumerate((x, src)) if t.dtype != out_dtype]
        for ins, outs in emitted(aten.cat.default, ([x, src], 0), {}, (2,)):
            assert all(ins[i][0] not in (Partial("sum"), Partial("avg")) for i in cast), (ins, outs)


@given(st.data())
def test_validator_mixed_dtypes(data) -> None:  # noqa: ANN001
    """Every emitted strategy of a mixed-dtype call reproduces torch on 1-D and 2-D meshes."""
    a_dtype, b_dtype = (data.draw(st.sampled_from((torch.float32, torch.float16, torch.int32, torch.int64, torch.bool)))
                        for _ in range(2))
    mesh = data.draw(st.sampled_from([(2,), (2, 2)]))
    a = (torch.randn(4, 5) * 100).to(a_dtype)
    b = (torch.randn(4, 2) * 100).to(b_dtype)
    for op, args in ((aten.cat.default, ([a, b], 1)), (aten.slice_scatter.default, (a, b, 1, 1, 5, 2))):
        report = check_rule(op, args, {}, mesh, max_nd_combos=100)
        assert report.ours.error is None and report.ours.incorrect == 0, report.summary()


def test_sharded_and_partial_max_through_widening() -> None:
    """max survives int32 -> int64 and fp16 -> fp32 (monotone): the result keeps the Partial."""
    a = torch.randint(-9, 9, (4, 3), dtype=torch.int32)
    b = torch.randint(-9, 9, (4, 2), dtype=torch.int64)
    with simulated_mesh((2, 2)) as mesh:
        da = to_dtensor(a, mesh, [Shard(0), Partial("max")])
        db = to_dtensor(b, mesh, [Shard(0), Partial("max")])
        out = torch.cat([da, db], 1)
        assert tuple(out.placements) == (Shard(0), Partial("max"))
        _same(full_value(out), torch.cat([a, b], 1), avg=False)

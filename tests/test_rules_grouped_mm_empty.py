"""_grouped_mm with empty operands through real DTensor dispatch, forward and backward.

Empty groups are normal in MoE: a rank can receive no tokens (M = 0), an expert no rows (repeated
``offs``), a dim can be 0. Contiguous empty tensors have strides like ``(1, 1)`` (``(16, 0)``), which
the kernel rejects, so DTensor's local operands (and the backward's transposed ones) must reach it
re-laid out. Oracle: plain torch on the full tensors, on one device; a call it accepts must work
through DTensor, with the same values and gradients; one it rejects must fail through DTensor too.
Layouts: every input row our rule offers (``single_dim_strategies``) and arbitrary ones (which
DTensor redistributes first), over 1-D and 2-D meshes, fp32 and bf16.
"""

from __future__ import annotations

from typing import NamedTuple

import pytest
import torch
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

import dtensor_rules  # noqa: F401  (installs our rules, the handler and the meta fallback)
from dtensor_rules.kernels.grouped_mm_checks import aligned_copy, kernel_accepts_layout
from dtensor_rules.op_rules.grouped_mm import GROUPED_MM, single_dim_strategies
from dtensor_rules.testing import simulated_mesh
from dtensor_rules.testing.dispatch import full_value, to_dtensor

DTYPES = [torch.float32, torch.bfloat16]
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}  # atol = rtol; plus rounding of the parts (_assert_matches)


class Call(NamedTuple):
    """One grouped mm: operands, offs (None for 3-D x 3-D), and the output gradient to pull back."""

    a: torch.Tensor
    b: torch.Tensor
    offs: torch.Tensor | None
    grad: torch.Tensor

    def rest(self) -> list[torch.Tensor]:
        return [] if self.offs is None else [self.offs]

    def __repr__(self) -> str:
        offs = None if self.offs is None else self.offs.tolist()
        return f"Call(a={tuple(self.a.shape)}{self.a.stride()}, b={tuple(self.b.shape)}{self.b.stride()}, offs={offs}, {self.a.dtype})"


@st.composite
def empty_calls(draw: st.DrawFn) -> Call:
    """A call with at least one empty dim or empty group: M = 0 (no tokens), G = 0, K or N = 0,
    or repeated ``offs`` (experts with no rows); operands row-major, column-major or padded."""
    mode = draw(st.sampled_from(["2x3", "3x2", "2x2", "3x3"]))
    dtype = draw(st.sampled_from(DTYPES))
    unit = 16 // dtype.itemsize
    size = lambda *xs: draw(st.sampled_from(xs))  # noqa: E731
    # zero K / N less often than zero M or G
    M, G, K, N = size(3, 0, 1, 0), size(2, 3, 1, 0), size(unit, 2 * unit, 2 * unit, 0), size(unit, 2 * unit, 2 * unit, 0)
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))

    def mat(*shape: int) -> torch.Tensor:
        layout = draw(st.sampled_from(["row-major", "column-major", "padded rows"]))
        if layout == "column-major":  # as the backward hands the kernel
            return torch.randn(*shape[:-2], shape[-1], shape[-2], generator=g).to(dtype).transpose(-2, -1)
        if layout == "padded rows":  # a view into wider rows: the one layout of a (.., 0) the kernel takes
            wide = torch.randn(*shape[:-1], (shape[-1] // unit + 1) * unit, generator=g).to(dtype)
            return wide.narrow(-1, 0, shape[-1])
        return torch.randn(*shape, generator=g).to(dtype)  # a contiguous (.., 0) has strides (.., 1, 1): rejected

    def offs(total: int) -> torch.Tensor:  # cuts drawn with repeats: empty groups are common
        cuts = sorted(draw(st.lists(st.sampled_from(sorted({0, total // 2, total})), min_size=G - 1, max_size=G - 1)))
        return torch.tensor(cuts + [total], dtype=torch.int32)

    # no groups (G = 0) leave nothing for the grouped dim: its size is 0 (else the kernel leaves it unwritten)
    if mode == "2x3":
        M = M if G else 0
        a, b, o, out = mat(M, K), mat(G, K, N), offs(M) if G else torch.zeros(0, dtype=torch.int32), (M, N)
    elif mode == "3x2":
        N = N if G else 0
        a, b, o, out = mat(G, M, K), mat(K, N), offs(N) if G else torch.zeros(0, dtype=torch.int32), (M, N)
    elif mode == "2x2":
        K = K if G else 0
        a, b, o, out = mat(M, K), mat(K, N), offs(K) if G else torch.zeros(0, dtype=torch.int32), (G, M, N)
    else:
        a, b, o, out = mat(G, M, K), mat(G, K, N), None, (G, M, N)
    empty_group = o is not None and bool((o.diff(prepend=o.new_zeros(1)) == 0).any())
    assume(0 in (*a.shape, *b.shape) or empty_group)
    return Call(a, b, o, torch.randn(*out, generator=g).to(dtype))


def _placements(draw: st.DrawFn, call: Call, mesh_ndim: int) -> tuple[list, list]:
    """Per mesh dim: an input row our rule offers for this mode, or any placement (redistributed)."""
    rows = single_dim_strategies(call.a.ndim, call.b.ndim, call.offs is not None)
    pa, pb = [], []
    for _ in range(mesh_ndim):
        if draw(st.booleans()):
            _, a, b, *_ = draw(st.sampled_from(rows))
        else:
            a, b = (draw(st.sampled_from([Replicate(), Partial("sum"), *map(Shard, range(t.ndim))])) for t in (call.a, call.b))
        pa.append(a)
        pb.append(b)
    return pa, pb


class Expected(NamedTuple):
    """What one device gives: the forward's error, or the output and both gradients. Where torch's
    own backward rejects the layouts it made (``backward_error``), the gradients come from
    :func:`_by_groups`: DTensor may raise that error too, or must give these values."""

    error: RuntimeError | None
    values: tuple[torch.Tensor, ...] = ()
    backward_error: RuntimeError | None = None


def _by_groups(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor | None) -> torch.Tensor:
    """Grouped mm spelled with plain matmuls, one per group (an independent oracle for gradients)."""
    if offs is None:
        return a @ b
    ends = offs.tolist()
    spans = list(zip([0, *ends[:-1]], ends))
    if a.ndim == 2 and b.ndim == 3:  # rows grouped
        return torch.cat([a[s:e] @ b[i] for i, (s, e) in enumerate(spans)] or [a[:0] @ b.sum(0)], 0)
    if a.ndim == 3:  # columns grouped
        return torch.cat([a[i] @ b[:, s:e] for i, (s, e) in enumerate(spans)] or [a.sum(0) @ b[:, :0]], 1)
    pieces = [a[:, s:e] @ b[s:e] for s, e in spans]  # K grouped: one output per group
    return torch.stack(pieces) if pieces else (a @ b).unsqueeze(0)[:0]


def _single_device(call: Call) -> Expected:
    a, b = call.a.clone().requires_grad_(), call.b.clone().requires_grad_()
    try:
        out = GROUPED_MM(a, b, *call.rest())
    except RuntimeError as e:
        return Expected(e)
    try:
        return Expected(None, (out.detach(), *torch.autograd.grad(out, (a, b), call.grad)))
    except RuntimeError as e:  # torch's backward hands its own kernel a layout it rejects (e.g. (0, 4, 0) column-major)
        a64, b64 = call.a.double().requires_grad_(), call.b.double().requires_grad_()
        ref = _by_groups(a64, b64, call.offs)
        grads = torch.autograd.grad(ref, (a64, b64), call.grad.double(), allow_unused=True)
        grads = [torch.zeros_like(t) if g is None else g for g, t in zip(grads, (a64, b64))]
        return Expected(None, (out.detach(), *(g.to(call.a.dtype) for g in grads)), backward_error=e)


@pytest.mark.parametrize("mesh_shape", [(2,), (2, 2)], ids=str)
@settings(suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(call=empty_calls(), data=st.data())
def test_empty_operands_match_single_device(mesh_shape: tuple[int, ...], call: Call, data: st.DataObject) -> None:
    want = _single_device(call)
    with simulated_mesh(mesh_shape) as mesh:
        pa, pb = _placements(data.draw, call, mesh.ndim)
        da = to_dtensor(call.a, mesh, pa).detach().requires_grad_()
        db = to_dtensor(call.b, mesh, pb, salt=3).detach().requires_grad_()
        rep = [Replicate()] * mesh.ndim
        rest = [to_dtensor(t, mesh, rep) for t in call.rest()]
        if want.error is not None:  # torch rejects the call: so must DTensor (never a made-up result)
            event("forward: torch's error")
            with pytest.raises(RuntimeError):
                GROUPED_MM(da, db, *rest)
            return
        out = GROUPED_MM(da, db, *rest)
        try:
            got = (out, *torch.autograd.grad(out, (da, db), to_dtensor(call.grad, mesh, rep)))
        except RuntimeError as e:
            if want.backward_error is None or "stride" not in str(e):
                raise
            event("backward: torch's own stride error, as on one device")
            return
        event("backward: by-group gradients" if want.backward_error else "backward: torch's gradients")
        _assert_matches(call, da, db, got, want.values, f"{call} with a {pa}, b {pb}")


def _parts_magnitude(d: DTensor) -> torch.Tensor:
    """The full tensor of |local| values: for a Partial the sum of its parts' magnitudes, which is
    what the rounding of the ranks' partial products scales with (bf16 parts of +-5 summing to 0.1)."""
    d = d.detach()
    mag = DTensor.from_local(d.to_local().abs(), d.device_mesh, d.placements, run_check=False, shape=d.shape, stride=d.stride())
    return full_value(mag).double()


def _assert_matches(call: Call, da: DTensor, db: DTensor, got: tuple, want: tuple, what: str) -> None:
    """out, grad a, grad b equal one device's within ``TOL`` plus a few eps of the same products
    taken over the parts' magnitudes (``_by_groups`` on |parts|, pulled back with |grad|)."""
    am, bm = _parts_magnitude(da).requires_grad_(), _parts_magnitude(db).requires_grad_()
    scale_out = _by_groups(am, bm, call.offs)
    scales = torch.autograd.grad(scale_out, (am, bm), call.grad.double().abs(), allow_unused=True)
    scales = [scale_out.detach(), *(torch.zeros_like(t) if s is None else s for s, t in zip(scales, (am, bm)))]
    tol, eps = TOL[call.a.dtype], torch.finfo(call.a.dtype).eps
    for name, g, w, scale in zip(("out", "grad a", "grad b"), got, want, scales):
        g = full_value(g)
        assert g.shape == w.shape and g.dtype == w.dtype, (name, what, g.shape, w.shape, g.dtype)
        err = (g.double() - w.double()).abs()
        allowed = tol + tol * w.double().abs() + 8 * eps * scale
        assert bool((err <= allowed).all()), f"{name} of {what}: max error {err.max()}, got {g}, want {w}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "a_shape, pa, b_shape, pb",
    [
        ((0, 16), Shard(1), (2, 16, 16), Shard(1)),  # M = 0 tokens on a 2-rank mesh, a and b sharded four ways
        ((0, 16), Shard(1), (2, 16, 16), Replicate()),
        ((0, 16), Shard(0), (2, 16, 16), Shard(1)),
        ((2, 0, 16), Shard(2), (2, 16, 16), Shard(1)),
    ],
    ids=["2x3 a S1 b S1", "2x3 a S1 b R", "2x3 a S0 b S1", "3x3 a S2 b S1"],
)
def test_zero_tokens_backward_with_sharded_operands_matches_one_device(dtype: torch.dtype, a_shape: tuple, pa, b_shape: tuple, pb) -> None:  # noqa: ANN001
    g = torch.Generator().manual_seed(0)
    offs = torch.tensor([0, 0], dtype=torch.int32) if len(a_shape) == 2 else None
    out_shape = (0, 16) if len(a_shape) == 2 else (2, 0, 16)
    call = Call(torch.randn(*a_shape, generator=g).to(dtype), torch.randn(*b_shape, generator=g).to(dtype), offs,
                torch.randn(*out_shape, generator=g).to(dtype))
    want = _single_device(call)
    assert want.error is None and want.backward_error is None, want  # one device accepts it, forward and backward
    with simulated_mesh((2,)) as mesh:
        da = to_dtensor(call.a, mesh, [pa]).detach().requires_grad_()
        db = to_dtensor(call.b, mesh, [pb]).detach().requires_grad_()
        out = GROUPED_MM(da, db, *[to_dtensor(t, mesh, [Replicate()]) for t in call.rest()])
        got = (out, *torch.autograd.grad(out, (da, db), to_dtensor(call.grad, mesh, [Replicate()])))
        _assert_matches(call, da, db, got, want.values, f"{call} with a {pa}, b {pb}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(16, 0), (0, 16), (0, 0), (3, 16, 0), (2, 0, 3)], ids=str)
def test_aligned_copy_of_empty_operands_is_accepted(dtype: torch.dtype, shape: tuple) -> None:
    """A contiguous empty operand can carry strides the kernel rejects ((16, 0) has (1, 1)); the
    copy the handler makes never does."""
    t = torch.empty(shape, dtype=dtype)
    fixed = aligned_copy(t)
    assert fixed.shape == t.shape and kernel_accepts_layout(fixed.shape, fixed.stride(), fixed.element_size())

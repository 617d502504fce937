"""_grouped_mm through DTensor for every local layout DTensor can hand the kernel.

The CPU kernel (fp32, fp16 and bf16 alike) rejects a leading stride that is not a multiple of
16 bytes, and checks it even on size-1 dims (a (1, 16) view with stride (18, 1) is rejected,
and ``.contiguous()`` returns it unchanged). DTensor produces such layouts: an uneven all-gather
un-pads with ``narrow()``; ``distribute_tensor`` of a column-major weight gives row-major shards.
Oracle: plain torch on the DTensors' full values, on one device.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

import dtensor_rules  # noqa: F401  (installs our rules and the handler)
from dtensor_rules.op_rules.grouped_mm import GROUPED_MM
from dtensor_rules.kernels.grouped_mm_checks import aligned_copy, chunk_sizes, kernel_accepts_layout
from dtensor_rules.testing import simulated_mesh
from dtensor_rules.testing.dispatch import full_value, to_dtensor
from tests.test_rules_grouped_mm import _runs

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOL = {torch.float32: {"atol": 1e-4, "rtol": 1e-4}, torch.float16: {"atol": 2e-2, "rtol": 2e-2},
       torch.bfloat16: {"atol": 0.15, "rtol": 0.05}}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_kernel_rejects_narrowed_size1_view_on_cpu(dtype: torch.dtype) -> None:
    """The real error condition on CPU, for every dtype: the layout an uneven all-gather leaves."""
    view = torch.randn(1, 18).to(dtype)[:, :16]
    assert view.stride() == (18, 1) and view.contiguous().stride() == (18, 1)
    b, offs = torch.randn(2, 16, 8).to(dtype), torch.tensor([0, 1], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="16 bytes"):
        GROUPED_MM(view, b, offs)
    assert not kernel_accepts_layout(view.shape, view.stride(), view.element_size())
    fixed = aligned_copy(view)
    assert kernel_accepts_layout(fixed.shape, fixed.stride(), fixed.element_size())
    torch.testing.assert_close(fixed, view, rtol=0, atol=0)
    torch.testing.assert_close(GROUPED_MM(fixed, b, offs), GROUPED_MM(torch.randn(0).new_tensor(view.tolist()).to(dtype), b, offs))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_k_sharded_unevenly_over_3_ranks_with_partial_b_matches_one_device(dtype: torch.dtype) -> None:
    """(1, 16) ``a`` sharded on K over 3 ranks (6, 5, 5), ``b`` Partial: single device works, so must DTensor."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(1, 16, generator=g).to(dtype), torch.randn(2, 16, 8, generator=g).to(dtype)
    offs = torch.tensor([0, 1], dtype=torch.int32)
    with simulated_mesh((3,)) as mesh:
        da, db = to_dtensor(a, mesh, [Shard(1)]), to_dtensor(b, mesh, [Partial("sum")])
        doffs = to_dtensor(offs, mesh, [Replicate()])
        out = GROUPED_MM(da, db, doffs)
        torch.testing.assert_close(full_value(out), GROUPED_MM(full_value(da), full_value(db), offs), **TOL[dtype])


def test_column_major_weight_distributed_row_major() -> None:
    """``distribute_tensor`` of a transposed (column-major) weight gives contiguous row-major shards."""
    g = torch.Generator().manual_seed(1)
    a = torch.randn(10, 16, generator=g).bfloat16()
    w = torch.randn(3, 12, 16, generator=g).bfloat16().transpose(-2, -1)  # (3, 16, 12) column-major
    offs = torch.tensor([2, 7, 10], dtype=torch.int32)
    expected = GROUPED_MM(a, w, offs)
    with simulated_mesh((2,)) as mesh:
        dw = distribute_tensor(w, mesh, [Shard(2)])  # local (3, 16, 6): row-major, leading stride 6 (12 bytes)
        da, doffs = distribute_tensor(a, mesh, [Replicate()]), distribute_tensor(offs, mesh, [Replicate()])
        out = GROUPED_MM(da, dw, doffs)
        torch.testing.assert_close(full_value(out), expected, **TOL[torch.bfloat16])


@st.composite
def calls(draw: st.DrawFn) -> tuple:
    """A grouped mm single-device torch accepts, with layouts: column-major / transposed operands,
    uneven sizes, and operands placed Replicate / Shard / Partial per mesh dim."""
    mode = draw(st.sampled_from(["2x3", "3x2", "2x2", "3x3"]))
    dtype = draw(st.sampled_from(DTYPES))
    unit = 16 // dtype.itemsize
    side = lambda: draw(st.sampled_from([unit, 2 * unit, 3 * unit]))  # noqa: E731  (global layouts accepted)
    G, K, N, M = draw(st.integers(1, 3)), side(), side(), draw(st.integers(1, 7))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    col_a, col_b = draw(st.booleans()), draw(st.booleans())

    def mat(*shape: int, col: bool) -> torch.Tensor:
        if col:
            return torch.randn(*shape[:-2], shape[-1], shape[-2], generator=g).to(dtype).transpose(-2, -1)
        return torch.randn(*shape, generator=g).to(dtype)

    def offs(total: int) -> torch.Tensor:
        cuts = sorted(draw(st.lists(st.integers(0, total), min_size=G - 1, max_size=G - 1)))
        return torch.tensor(cuts + [total], dtype=torch.int32)

    if mode == "2x3":
        args = (mat(M, K, col=col_a), mat(G, K, N, col=col_b), offs(M))
    elif mode == "3x2":
        args = (mat(G, M, K, col=col_a), mat(K, N, col=col_b), offs(N))
    elif mode == "2x2":
        args = (mat(M, K, col=col_a), mat(K, N, col=col_b), offs(K))
    else:
        args = (mat(G, M, K, col=col_a), mat(G, K, N, col=col_b))
    return args


def _placements(draw: st.DrawFn, t: torch.Tensor, mesh_ndim: int) -> list:
    options = [Replicate(), Partial("sum")] + [Shard(d) for d in range(t.ndim)]
    return [draw(st.sampled_from(options)) for _ in range(mesh_ndim)]


@pytest.mark.slow  # over ~9 s of the inner loop (pyproject.toml)
@pytest.mark.parametrize("mesh_shape", [(2,), (3,), (2, 2), (2, 3)], ids=str)
def test_any_input_layout_matches_single_device(mesh_shape: tuple[int, ...]) -> None:
    """Hypothesis over layouts and placements, plus a redistribution before the call: DTensor
    always gives single-device torch's answer (or, never here, torch's error)."""

    @given(args=calls(), data=st.data())
    def case(args: tuple, data: st.DataObject) -> None:
        assume(_runs(args))
        a, b = args[0], args[1]
        with simulated_mesh(mesh_shape) as mesh:
            da = to_dtensor(a, mesh, _placements(data.draw, a, mesh.ndim))
            db = to_dtensor(b, mesh, _placements(data.draw, b, mesh.ndim))
            if data.draw(st.booleans()):  # after a redistribution (uneven gathers un-pad with narrow())
                da = da.redistribute(mesh, [Replicate()] * mesh.ndim)
            rest = [to_dtensor(t, mesh, [Replicate()] * mesh.ndim) for t in args[2:]]
            out = GROUPED_MM(da, db, *rest)
            expected = GROUPED_MM(full_value(da), full_value(db), *args[2:])
            _close_with_parts(full_value(out), expected, _magnitude(da, mesh), _magnitude(db, mesh), args[2:])

    case()


def _magnitude(d: DTensor, mesh) -> torch.Tensor:  # noqa: ANN001
    """The full tensor of |local| values under ``d``'s placements: for a Partial the sum of its parts'
    magnitudes, which is what the rounding of a reduction scales with (fp16 parts of +-3 summing to 0.1)."""
    mag = DTensor.from_local(d.to_local().abs(), mesh, d.placements, run_check=False, shape=d.shape, stride=d.stride())
    return full_value(mag).float()


def _close_with_parts(got: torch.Tensor, want: torch.Tensor, mag_a: torch.Tensor, mag_b: torch.Tensor, rest) -> None:  # noqa: ANN001
    """``TOL`` plus a rounding allowance of a few eps times |a| @ |b| (the magnitudes the ranks summed)."""
    tol = TOL[want.dtype]
    scale = GROUPED_MM(mag_a.to(want.dtype), mag_b.to(want.dtype), *rest).float()
    allowed = tol["atol"] + tol["rtol"] * want.float().abs() + 4 * torch.finfo(want.dtype).eps * scale
    assert got.dtype == want.dtype and got.shape == want.shape
    assert bool(((got.float() - want.float()).abs() <= allowed).all()), (got, want)


@given(size=st.integers(0, 40), parts=st.integers(1, 9))
def test_chunk_sizes_are_the_distinct_dtensor_shard_sizes(size: int, parts: int) -> None:
    """The per-(mesh dim, local size) filter enumerates exactly the sizes torch.chunk semantics give."""
    from dtensor_rules._upstream import compute_local_shape_and_global_offset

    real = {
        compute_local_shape_and_global_offset((size,), (parts,), [r], [Shard(0)])[0][0] for r in range(parts)
    }
    assert chunk_sizes(size, parts) == real

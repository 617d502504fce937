"""aten._grouped_mm: every emitted strategy matches single-device torch (hypothesis over modes, dtypes,
uneven groups and shapes, 1-D/2-D/3-D meshes), the alignment predicate equals the CPU kernel's,
fp32 runs through DTensor (meta fallback), end-to-end forward and backward, golden tables."""

from __future__ import annotations

import pytest
import torch
from expecttest import assert_expected_inline
from hypothesis import assume, given
from hypothesis import strategies as st
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

import dtensor_rules  # noqa: F401  (installs our rules and the meta fallback)
from dtensor_rules.op_rules.grouped_mm import GROUPED_MM, kernel_accepts_layout
from dtensor_rules.testing import check_rule, check_samples, simulated_mesh
from dtensor_rules.testing.suites import samples_for
from dtensor_rules.testing.tables import strategy_table
from tests._examples import scaled

MESHES = [(2,), (4,), (2, 2), (2, 4), (2, 2, 2)]
# share of the profile's examples per mesh: validating every combo of (2, 4) and the 3-D mesh (8 ranks)
# costs ~10x the 2-rank mesh, so they get a fifth of the examples
EXAMPLES = {(2,): 1.0, (4,): 0.8, (2, 2): 0.5, (2, 4): 0.2, (2, 2, 2): 0.2}


def _offs(total: int, groups: int, draw: st.DrawFn) -> torch.Tensor:
    cuts = sorted(draw(st.lists(st.integers(0, total), min_size=groups - 1, max_size=groups - 1)))
    return torch.tensor(cuts + [total], dtype=torch.int32)  # last end == total: no uninitialized rows


@st.composite
def grouped_mm_calls(draw: st.DrawFn) -> tuple:
    mode = draw(st.sampled_from(["2x3", "3x2", "2x2", "3x3"]))
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16]))
    unit = 16 // dtype.itemsize  # aligned sides most of the time, sometimes a misaligned one
    side = lambda: draw(st.sampled_from([unit, 2 * unit, 3 * unit, unit // 2 * 3]))  # noqa: E731
    free = lambda: draw(st.integers(1, 7))  # noqa: E731
    G, K, N, M = draw(st.integers(1, 4)), side(), side(), free()
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    r = lambda *s: torch.randn(*s, generator=g).to(dtype)  # noqa: E731
    transpose_b = draw(st.booleans())

    def weight(*shape: int) -> torch.Tensor:  # optionally column-major, as the backward produces
        return r(*shape[:-2], shape[-1], shape[-2]).transpose(-2, -1) if transpose_b else r(*shape)

    if mode == "2x3":
        return (r(M, K), weight(G, K, N), _offs(M, G, draw))
    if mode == "3x2":
        return (r(G, M, K), weight(K, N), _offs(N, G, draw))
    if mode == "2x2":
        return (r(M, K), weight(K, N), _offs(K, G, draw))
    return (r(G, M, K), weight(G, K, N))


def _runs(args: tuple) -> bool:
    try:
        GROUPED_MM(*args)
        return True
    except RuntimeError:
        return False


@pytest.mark.slow  # over ~9 s of the inner loop (pyproject.toml)
@pytest.mark.parametrize("mesh", MESHES, ids=str)
def test_every_emitted_strategy_is_correct(mesh) -> None:  # noqa: ANN001
    @scaled(EXAMPLES[mesh])
    @given(args=grouped_mm_calls())
    def case(args: tuple) -> None:
        assume(_runs(args))
        r = check_rule(GROUPED_MM, args, {}, mesh, max_nd_combos=200)
        assert r.ours.error is None, r.ours.error
        assert r.ours.incorrect == 0, r.summary()

    case()


@pytest.mark.slow  # over ~9 s of the inner loop (pyproject.toml)
@pytest.mark.parametrize("mesh", [(2,), (4,), (2, 2)], ids=str)
def test_suite_no_incorrect_and_beats_upstream(mesh) -> None:  # noqa: ANN001
    r = check_samples(GROUPED_MM, samples_for(GROUPED_MM), mesh)
    assert r.ours.error is None and r.ours.incorrect == 0, r.summary()
    assert r.ours.correct >= r.upstream.correct, r.summary()


@scaled(4)  # one CPU kernel call an example (~ms): four times the profile's count over the layout space
@given(
    rows=st.sampled_from([8, 16]), cols=st.integers(0, 9), col_major=st.booleans(), pad=st.integers(0, 5),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
)
def test_alignment_predicate_matches_cpu_kernel(rows, cols, col_major, pad, dtype) -> None:  # noqa: ANN001
    """Our per-rank filter uses kernel_accepts_layout; it must say yes exactly when the CPU kernel does."""
    lead = (rows if col_major else cols) + pad
    base = torch.randn(max(lead * (cols if col_major else rows), 1) + 16).to(dtype)
    stride = (1, lead) if col_major else (lead, 1)
    b = base.as_strided((rows, cols), stride)
    a = torch.randn(4, rows).to(dtype)  # rows of 8 or 16 elements: always aligned, so only b decides
    offs = torch.tensor([1, 4], dtype=torch.int32)
    accepted = True
    try:
        GROUPED_MM(a, b.unsqueeze(0).expand(2, rows, cols), offs)
    except RuntimeError as e:
        assert "16 bytes" in str(e) or "stride" in str(e).lower(), e
        accepted = False
    assert kernel_accepts_layout(b.shape, b.stride(), dtype.itemsize) == accepted


def test_golden_2x3_table() -> None:
    args = (torch.randn(8, 8), torch.randn(2, 8, 8), torch.tensor([3, 8], dtype=torch.int32))
    assert_expected_inline(strategy_table(GROUPED_MM, args), """\
(P(avg), R, R) -> (P(avg))
(P(sum), R, R) -> (P(sum))
(R, P(avg), R) -> (P(avg))
(R, P(sum), R) -> (P(sum))
(R, R, R) -> (R)
(R, S(2), R) -> (S(1))
(S(1), S(1), R) -> (P(sum))""")


def test_golden_3x3_table_drops_misaligned_shards() -> None:
    """bf16 K=16 splits into 8 (16 bytes, kept); N=8 would split into 4 (8 bytes), so no N sharding."""
    args = (torch.randn(2, 4, 16).bfloat16(), torch.randn(2, 16, 8).bfloat16())
    assert_expected_inline(strategy_table(GROUPED_MM, args), """\
(P(avg), R) -> (P(avg))
(P(sum), R) -> (P(sum))
(R, P(avg)) -> (P(avg))
(R, P(sum)) -> (P(sum))
(R, R) -> (R)
(S(0), S(0)) -> (S(0))
(S(1), R) -> (S(1))
(S(2), S(1)) -> (P(sum))""")


def test_uneven_shards_must_be_aligned_on_every_rank() -> None:
    """fp32 needs local N % 4 == 0 on every rank: N=36 on 5 ranks (8,8,8,8,4) is offered, N=20 on 3 ranks
    (7,7,6) and N=24 on 4 ranks (6 each) are not."""
    offs = torch.tensor([3, 8], dtype=torch.int32)
    table = lambda n, m: strategy_table(GROUPED_MM, (torch.randn(8, 8), torch.randn(2, 8, n), offs), mesh_shape=(m,))  # noqa: E731
    assert "(R, S(2), R) -> (S(1))" in table(36, 5)
    assert "S(2)" not in table(20, 3)
    assert "S(2)" not in table(24, 4)


# ----------------------------------------------------------------------------------------- DTensor end to end
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_dtensor_forward_and_backward_match_single_device(dtype) -> None:  # noqa: ANN001
    """2-D x 3-D (MoE up-projection): N sharded weights; backward runs two more grouped mms (one column-major)."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(12, 16, generator=g).to(dtype), torch.randn(3, 16, 16, generator=g).to(dtype)
    offs = torch.tensor([3, 7, 12], dtype=torch.int32)
    ra, rb = a.clone().requires_grad_(), b.clone().requires_grad_()
    (GROUPED_MM(ra, rb, offs) ** 2).sum().backward()
    with simulated_mesh((2,)) as mesh:
        da = distribute_tensor(a, mesh, [Replicate()]).requires_grad_()
        db = distribute_tensor(b, mesh, [Shard(2)]).requires_grad_()
        doffs = distribute_tensor(offs, mesh, [Replicate()])
        out = GROUPED_MM(da, db, doffs)
        assert out.placements == (Shard(1),)
        # grad a is a Partial(sum) over the N shards: fp32 rounding differs from one device's order
        tol = {"atol": 0.1, "rtol": 0.05} if dtype == torch.bfloat16 else {"atol": 1e-4, "rtol": 1e-5}
        torch.testing.assert_close(out.full_tensor(), GROUPED_MM(a, b, offs), **tol)
        (out**2).sum().backward()
        torch.testing.assert_close(da.grad.full_tensor(), ra.grad, **tol)
        torch.testing.assert_close(db.grad.full_tensor(), rb.grad, **tol)


def test_dtensor_3x3_experts_sharded_on_2d_mesh() -> None:
    a, b = torch.randn(4, 5, 8), torch.randn(4, 8, 8)
    with simulated_mesh((2, 2)) as mesh:
        out = GROUPED_MM(distribute_tensor(a, mesh, [Shard(0), Shard(1)]), distribute_tensor(b, mesh, [Shard(0), Replicate()]))
        assert out.placements == (Shard(0), Shard(1))
        torch.testing.assert_close(out.full_tensor(), GROUPED_MM(a, b))


def test_dtensor_rejects_what_torch_rejects() -> None:
    """Misaligned global operands and bias fail through DTensor with torch's own kind of error."""
    with simulated_mesh((2,)) as mesh:
        rep = lambda t: distribute_tensor(t, mesh, [Replicate()])  # noqa: E731
        offs = rep(torch.tensor([2, 6], dtype=torch.int32))
        with pytest.raises(RuntimeError, match="16 bytes"):
            GROUPED_MM(rep(torch.randn(6, 6)), rep(torch.randn(2, 6, 8)), offs)
        with pytest.raises(RuntimeError, match="[Bb]ias"):
            GROUPED_MM(rep(torch.randn(6, 8)), rep(torch.randn(2, 8, 8)), offs, rep(torch.randn(2, 8)))


def test_plain_offs_is_rejected_with_instructions() -> None:
    """offs usually differs per rank under expert parallelism, so it is not silently replicated."""
    with simulated_mesh((2,)) as mesh:
        rep = lambda t: distribute_tensor(t, mesh, [Replicate()])  # noqa: E731
        with pytest.raises(RuntimeError, match="mixed torch.Tensor and DTensor, need to convert all torch.Tensor to DTensor"):
            GROUPED_MM(rep(torch.randn(6, 8)), rep(torch.randn(2, 8, 8)), torch.tensor([2, 6], dtype=torch.int32))

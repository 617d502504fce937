"""The custom op torch.ops.dtensor_rules.moe_permute_indices: registration, tracing, errors, _grouped_mm."""

from __future__ import annotations

import pytest
import torch
from tests._moe_index_cases import Case, cases, oracle
from hypothesis import given
from hypothesis import strategies as st
from torch.fx.experimental.proxy_tensor import make_fx

from dtensor_rules.kernels import moe_permute_indices, permuted_length_bound

OP = torch.ops.dtensor_rules.moe_permute_indices.default


def sample_args() -> tuple:
    return (torch.tensor([4, 0, 2, 3, 1, 0, 0, 5], dtype=torch.int32), 4, 2, 40, 8)


def test_public_function_is_the_op() -> None:
    args = sample_args()
    for got, want in zip(moe_permute_indices(*args), OP(*args)):
        assert torch.equal(got, want)
    want = oracle(tuple(args[0].tolist()), 4, 2, 40, 8)
    assert tuple(t.tolist() for t in moe_permute_indices(*args)) == want


def test_opcheck() -> None:
    # schema, fake impl vs real outputs, dispatch registrations, aot_dispatch (static and dynamic)
    torch.library.opcheck(OP, sample_args())


def test_make_fx_records_the_op_and_replays() -> None:
    args = sample_args()
    fn = lambda c: moe_permute_indices(c, *args[1:])  # noqa: E731
    gm = make_fx(fn, tracing_mode="fake")(args[0])
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert OP in targets
    other = torch.tensor([0, 9, 0, 1, 0, 0, 3, 2], dtype=torch.int32)  # new data, same graph
    for got, want in zip(gm(other), OP(other, *args[1:])):
        assert torch.equal(got, want)


def test_make_fx_symbolic_max_len_from_a_token_count() -> None:
    counts = sample_args()[0]
    fn = lambda x, c: moe_permute_indices(c, 4, 2, x.shape[0] + 32, 8)  # noqa: E731
    gm = make_fx(fn, tracing_mode="symbolic")(torch.randn(15, 4), counts)
    perm, _, offs = gm(torch.randn(20, 4), counts)  # replay with another token count
    assert perm.shape == (52,) and offs.tolist() == [8, 16, 24, 32]


@pytest.mark.slow
def test_torch_compile_fullgraph() -> None:
    args = sample_args()

    @torch.compile(backend="aot_eager", fullgraph=True)
    def fn(c: torch.Tensor) -> torch.Tensor:
        perm, sizes, offs = moe_permute_indices(c, *args[1:])
        return perm + 1, offs * 2

    perm, offs = fn(args[0])
    want = OP(*args)
    assert torch.equal(perm, want[0] + 1) and torch.equal(offs, want[2] * 2)


def test_fake_impl_rejects_bad_static_args_at_trace_time() -> None:
    with pytest.raises(ValueError, match=r"shape \(num_ranks \* experts_per_rank,\)"):
        make_fx(lambda c: moe_permute_indices(c, 4, 3, 64, 8), tracing_mode="fake")(sample_args()[0])


def test_negative_counts_raise() -> None:
    with pytest.raises(ValueError, match="negative counts"):
        moe_permute_indices(torch.tensor([3, -1], dtype=torch.int32), 2, 1, 32, 8)


def test_undersized_max_len_raises_instead_of_truncating() -> None:
    counts = torch.tensor([9, 0], dtype=torch.int32)  # needs 16 + 8 slots
    with pytest.raises(ValueError, match=r"need 24 slots but max_len=23"):
        moe_permute_indices(counts, 2, 1, 23, 8)
    assert moe_permute_indices(counts, 2, 1, 24, 8)[2].tolist() == [16, 24]


def expected_expert_rows(case: Case) -> list[int]:
    """Expert of every received row, from the rank-major layout (oracle for the combine)."""
    E = case.experts_per_rank
    return [g % E for g, n in enumerate(case.counts) for _ in range(n)]


@given(cases(max_count=30), st.sampled_from([torch.float32, torch.bfloat16]))
def test_offs_feed_grouped_mm(case: Case, dtype: torch.dtype) -> None:
    # CPU _grouped_mm (torch 2.13): 2-D x 3-D with int32 offs, fp32/bf16/fp16, strides multiple of 16 bytes
    E, K, N = case.experts_per_rank, 16, 8
    g = torch.Generator().manual_seed(sum(case.counts))
    x = torch.randn(sum(case.counts), K, generator=g).to(dtype)
    w = torch.randn(E, K, N, generator=g).to(dtype)
    perm, sizes, offs = moe_permute_indices(*case.args())

    x_grouped = torch.cat([x, x.new_zeros(1, K)])[perm.long()]  # -1 picks the appended zero row
    y = torch._grouped_mm(x_grouped, w, offs=offs)
    pad = perm < 0
    in_blocks = torch.arange(case.max_len) < offs[-1]
    # padding inside the expert blocks multiplies zero rows: zeros. Rows past offs[-1] are not
    # computed at all (uninitialized memory on CPU), so the combine must drop every -1 slot.
    assert torch.equal(y[pad & in_blocks], torch.zeros_like(y[pad & in_blocks]))
    out = x.new_zeros(x.shape[0], N)
    out[perm[~pad].long()] = y[~pad]

    experts = expected_expert_rows(case)
    want = torch.stack([x[i].float() @ w[e].float() for i, e in enumerate(experts)]) if experts else out.float()
    tol = {} if dtype == torch.float32 else {"atol": 5e-2, "rtol": 2e-2}
    torch.testing.assert_close(out.float(), want, **tol)


def test_length_bound_is_enough_for_the_worst_case() -> None:
    # every expert one token past an alignment boundary, plus an empty expert: the bound holds exactly
    counts = torch.tensor([9, 9, 0], dtype=torch.int32)
    bound = permuted_length_bound(18, 3, 8)
    assert int(moe_permute_indices(counts, 3, 1, bound, 8)[2][-1]) <= bound == 42

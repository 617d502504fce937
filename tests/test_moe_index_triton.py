"""The Triton kernel (run by Triton's interpreter on CPU tensors) against the reference and the oracle.

Needs the optional ``triton`` extra; without it the whole module is skipped with a visible reason.
"""

from __future__ import annotations

import pytest

pytest.importorskip("triton", reason="the Triton MoE index kernel needs the optional extra: pip install '.[triton]'")

import torch  # noqa: E402
from tests._moe_index_cases import Case, cases, oracle  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from dtensor_rules.kernels import permute_indices_reference, permute_indices_triton  # noqa: E402
from dtensor_rules.kernels.moe_index_reference import expert_layout  # noqa: E402
from dtensor_rules.kernels.moe_index_triton import scatter_group_indices  # noqa: E402
@given(cases(), st.sampled_from([16, 32, 128]), st.sampled_from([torch.int32, torch.int64]))
def test_interpreted_kernel_matches_reference_and_oracle(case: Case, block: int, dtype: torch.dtype) -> None:
    # small blocks make skewed groups loop over several chunks
    got = permute_indices_triton(*case.args(dtype), block=block)
    want = permute_indices_reference(*case.args(dtype))
    for g, w in zip(got, want):
        assert g.dtype == w.dtype == torch.int32
        assert torch.equal(g, w)
    expected = oracle(case.counts, case.experts_per_rank, case.num_ranks, case.max_len, case.alignment)
    assert tuple(t.tolist() for t in got) == expected


@given(cases(), st.integers(0, 64))
def test_kernel_never_writes_past_max_len(case: Case, short: int) -> None:
    # an undersized max_len must not write out of bounds: the kernel keeps the in-range prefix
    max_len = max(case.needed - short, 0)
    counts = case.tensor()
    src, dst, _, _ = expert_layout(counts, case.experts_per_rank, case.num_ranks, case.alignment)
    got = scatter_group_indices(counts, src, dst, max_len, block=16)
    full = oracle(case.counts, case.experts_per_rank, case.num_ranks, case.max_len, case.alignment)[0]
    assert got.tolist() == full[:max_len]


def test_block_must_be_a_power_of_two() -> None:
    counts = torch.ones(2, dtype=torch.int32)
    src, dst, _, _ = expert_layout(counts, 2, 1, 8)
    with pytest.raises(ValueError, match="power of two"):
        scatter_group_indices(counts, src, dst, 16, block=24)

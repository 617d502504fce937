"""The torch reference of moe_permute_indices against the spec oracle, and its input checks."""

from __future__ import annotations

import pytest
import torch
from tests._moe_index_cases import Case, cases, oracle
from hypothesis import given
from hypothesis import strategies as st
from torch.fx.experimental.proxy_tensor import make_fx

from dtensor_rules.kernels import permute_indices_reference, permuted_length_bound
from tests._examples import scaled



def as_lists(result: tuple[torch.Tensor, ...]) -> tuple[list[int], ...]:
    assert all(t.dtype == torch.int32 for t in result)
    return tuple(t.tolist() for t in result)


def test_worked_example() -> None:
    # rank 0 sends (4, 0, 2, 3) tokens to experts 0..3, rank 1 sends (1, 0, 0, 5): rows 0-8 come
    # from rank 0 (e0: 0-3, e2: 4-5, e3: 6-8), rows 9-14 from rank 1 (e0: 9, e3: 10-14)
    counts = torch.tensor([4, 0, 2, 3, 1, 0, 0, 5], dtype=torch.int32)
    perm, sizes, offs = as_lists(permute_indices_reference(counts, 4, 2, 36, 8))
    assert sizes == [8, 8, 8, 8]  # e1 is empty but still gets one alignment unit
    assert offs == [8, 16, 24, 32]
    assert perm == (
        [0, 1, 2, 3, 9, -1, -1, -1]
        + [-1] * 8
        + [4, 5, -1, -1, -1, -1, -1, -1]
        + [6, 7, 8, 10, 11, 12, 13, 14]
        + [-1] * 4
    )
@scaled(5)  # the pure-torch reference on small counts, ~ms an example: five times the profile's count
@given(cases(), st.sampled_from([torch.int32, torch.int64]))
def test_matches_oracle(case: Case, dtype: torch.dtype) -> None:
    got = as_lists(permute_indices_reference(*case.args(dtype)))
    assert got == oracle(case.counts, case.experts_per_rank, case.num_ranks, case.max_len, case.alignment)
@scaled(5)  # the pure-torch reference on small counts, ~ms an example: five times the profile's count
@given(cases())
def test_sizes_are_aligned_and_hold_every_token(case: Case) -> None:
    perm, sizes, offs = permute_indices_reference(*case.args())
    assert bool((sizes % case.alignment == 0).all()) and bool((sizes >= case.alignment).all())
    valid = perm[perm >= 0]
    # every received row appears exactly once
    assert sorted(valid.tolist()) == list(range(sum(case.counts)))
    assert int(offs[-1]) <= permuted_length_bound(sum(case.counts), case.experts_per_rank, case.alignment)


def test_slots_past_max_len_are_not_represented() -> None:
    # the reference is a gather over [0, max_len): a short max_len gives the prefix (the op rejects it)
    counts = torch.tensor([5, 3], dtype=torch.int32)
    full = permute_indices_reference(counts, 2, 1, 16, 8)[0]
    short = permute_indices_reference(counts, 2, 1, 10, 8)[0]
    assert torch.equal(short, full[:10])


def test_traces_without_reading_data() -> None:
    # fake tensors have no values: any .item()/data-dependent shape would fail to trace
    counts = torch.tensor([3, 0, 9, 1, 2, 2], dtype=torch.int64)
    gm = make_fx(lambda c: permute_indices_reference(c, 3, 2, 40, 16), tracing_mode="fake")(counts)
    for got, want in zip(gm(counts), permute_indices_reference(counts, 3, 2, 40, 16)):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize(
    "args, message",
    [
        ((torch.zeros(6, dtype=torch.int32), 4, 2, 16, 8), r"shape \(num_ranks \* experts_per_rank,\) = \(8,\)"),
        ((torch.zeros(8), 4, 2, 16, 8), "must be int32 or int64"),
        ((torch.zeros(8, dtype=torch.int32), 4, 2, 16, 0), "alignment must be an int >= 1"),
        ((torch.zeros(8, dtype=torch.int32), 0, 2, 16, 8), "experts_per_rank must be an int >= 1"),
        ((torch.zeros(8, dtype=torch.int32), 4, 2, -1, 8), "max_len must be an int >= 0"),
        ((torch.zeros(8, dtype=torch.int32), 4, 2, 2**31, 8), "does not fit the int32"),
    ],
)
def test_bad_arguments_are_named(args: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        permute_indices_reference(*args)

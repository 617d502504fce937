"""Shared by tests/test_moe_index*.py: a spec-level oracle and hypothesis cases for the MoE index op.

The oracle is written from the op's documented semantics with plain Python lists, not
from the implementation, so it checks the torch reference and the Triton kernel alike.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from hypothesis import strategies as st


@dataclass(frozen=True)
class Case:
    counts: tuple[int, ...]  # rank-major: counts[r * E + e]
    experts_per_rank: int
    num_ranks: int
    alignment: int
    slack: int  # extra slots past the padded total

    def tensor(self, dtype: torch.dtype = torch.int32) -> torch.Tensor:
        return torch.tensor(self.counts, dtype=dtype)

    @property
    def needed(self) -> int:
        return sum(oracle_sizes(self.counts, self.experts_per_rank, self.num_ranks, self.alignment))

    @property
    def max_len(self) -> int:
        return self.needed + self.slack

    def args(self, dtype: torch.dtype = torch.int32) -> tuple:
        return (self.tensor(dtype), self.experts_per_rank, self.num_ranks, self.max_len, self.alignment)


def oracle_sizes(counts: tuple[int, ...], E: int, R: int, alignment: int) -> list[int]:
    sizes = []
    for e in range(E):
        n = sum(counts[r * E + e] for r in range(R))
        rows = max(n, alignment)
        sizes.append((rows + alignment - 1) // alignment * alignment)
    return sizes


def oracle(counts: tuple[int, ...], E: int, R: int, max_len: int, alignment: int) -> tuple[list[int], list[int], list[int]]:
    """(permuted_indices, m_sizes, m_offsets) as Python lists, straight from the docstring."""
    rows: dict[tuple[int, int], list[int]] = {}
    next_row = 0
    for r in range(R):
        for e in range(E):
            n = counts[r * E + e]
            rows[r, e] = list(range(next_row, next_row + n))
            next_row += n
    sizes = oracle_sizes(counts, E, R, alignment)
    out: list[int] = []
    for e, size in enumerate(sizes):
        block = [i for r in range(R) for i in rows[r, e]]
        out += block + [-1] * (size - len(block))
    assert len(out) <= max_len, "oracle called with a max_len that does not fit"
    out += [-1] * (max_len - len(out))
    return out, sizes, list(itertools.accumulate(sizes))


@st.composite
def cases(draw: st.DrawFn, max_experts: int = 6, max_ranks: int = 4, max_count: int = 40) -> Case:
    """Counts that are random, all zero, one hot expert, or hugely skewed; alignments 1..32."""
    E = draw(st.integers(1, max_experts))
    R = draw(st.integers(1, max_ranks))
    G = E * R
    kind = draw(st.sampled_from(["random", "zeros", "one_hot", "skew", "sparse"]))
    if kind == "zeros":
        counts = [0] * G
    elif kind == "one_hot":  # every rank routes everything to one expert
        hot = draw(st.integers(0, E - 1))
        counts = [draw(st.integers(0, max_count)) if e == hot else 0 for _ in range(R) for e in range(E)]
    elif kind == "skew":
        counts = draw(st.lists(st.integers(0, 3), min_size=G, max_size=G))
        counts[draw(st.integers(0, G - 1))] = draw(st.integers(200, 700))
    elif kind == "sparse":
        counts = draw(st.lists(st.sampled_from([0, 0, 0, 1, 7, 16, 17]), min_size=G, max_size=G))
    else:
        counts = draw(st.lists(st.integers(0, max_count), min_size=G, max_size=G))
    alignment = draw(st.sampled_from([1, 8, 16, 32]) | st.integers(1, 33))
    slack = draw(st.sampled_from([0, 0, 1, 5, 64]))
    return Case(tuple(counts), E, R, alignment, slack)

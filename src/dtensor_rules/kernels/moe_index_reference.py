"""Pure-torch reference of the MoE permute-indices computation (sync-free, any device).

Layout of the input (``R = num_ranks``, ``E = experts_per_rank``)::

    tokens_per_expert_group[r * E + e] = tokens that rank r sends to local expert e

The received tokens sit in that order (rank-major) in the receive buffer, so the
tokens of group (r, e) occupy source rows ``[src_start[r, e], src_start[r, e] + count)``.
The expert-grouped layout puts expert 0's block first, then expert 1's, ...; inside a
block the ranks are in order; each block is padded to ``m_sizes[e]`` rows.

This module is the semantics. It is written as a *gather*: every output slot finds
its source with two binary searches, so it uses only static shapes and never reads
a device value on the host (no ``.item()``, no data-dependent sizes). The Triton
kernel (``moe_index_triton``) is an independent *scatter* implementation of the same
function; tests check that the two agree.
"""

from __future__ import annotations

import torch

__all__ = [
    "check_static_args",
    "expert_layout",
    "permute_indices_reference",
    "permuted_length_bound",
    "INDEX_DTYPE",
    "COUNT_DTYPES",
]

INDEX_DTYPE = torch.int32  # permuted_indices, m_sizes, m_offsets (``offs`` of _grouped_mm must be int32)
COUNT_DTYPES = (torch.int32, torch.int64)
_INT32_MAX = 2**31 - 1


def check_static_args(
    counts_shape: tuple[int, ...] | torch.Size,
    counts_dtype: torch.dtype,
    experts_per_rank: int,
    num_ranks: int,
    max_len: int,
    alignment: int,
) -> None:
    """Raise ``ValueError`` naming the problem for anything wrong that is known without the data.

    A bound on a symbolic size (under dynamic-shape tracing ``max_len`` is derived from a token
    count, unbacked when the count is data-dependent) becomes a runtime check of the compiled
    graph instead: asking ``max_len < 0`` of an unbacked size would fail the trace.
    """
    for name, value, low in (("experts_per_rank", experts_per_rank, 1), ("num_ranks", num_ranks, 1),
                             ("alignment", alignment, 1), ("max_len", max_len, 0)):
        if isinstance(value, bool) or not isinstance(value, (int, torch.SymInt)):
            raise ValueError(f"moe_permute_indices: {name} must be an int >= {low}, got {value!r}")
        _check_bound(value >= low, f"moe_permute_indices: {name} must be an int >= {low}, got {value!r}")
    _check_bound(max_len <= _INT32_MAX, f"moe_permute_indices: max_len={max_len} does not fit the int32 index output")
    if counts_dtype not in COUNT_DTYPES:
        raise ValueError(
            f"moe_permute_indices: tokens_per_expert_group must be int32 or int64, got {counts_dtype}; "
            "convert it with .to(torch.int32)"
        )
    expected = experts_per_rank * num_ranks
    if tuple(counts_shape) != (expected,):
        raise ValueError(
            f"moe_permute_indices: tokens_per_expert_group must have shape (num_ranks * experts_per_rank,) = "
            f"({expected},) for num_ranks={num_ranks}, experts_per_rank={experts_per_rank}; got "
            f"{tuple(counts_shape)}"
        )


def _check_bound(holds: bool | torch.SymBool, message: str) -> None:
    """``ValueError(message)`` now if a concrete bound fails; a symbolic one is checked at run time."""
    if isinstance(holds, torch.SymBool):
        torch._check(holds, lambda: message)  # no guard: a deferred runtime assert for unbacked sizes
    elif not holds:
        raise ValueError(message)


def permuted_length_bound(num_tokens: int, experts_per_rank: int, alignment: int) -> int:
    """A ``max_len`` that always holds ``num_tokens`` received tokens after padding.

    Each expert's block grows by at most ``alignment`` rows (``n >= 1`` rounds up by at
    most ``alignment - 1``; an empty expert gets exactly ``alignment``).
    """
    return num_tokens + experts_per_rank * alignment


def expert_layout(
    counts: torch.Tensor, experts_per_rank: int, num_ranks: int, alignment: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Prefix sums shared by both implementations, all int64 on ``counts.device``.

    Returns ``(src_start, dst_start, m_sizes, m_offsets)``: per group (input order
    ``r * E + e``) the first source row and the first destination slot, and per expert
    the padded block size and its inclusive cumulative sum.
    """
    c = counts.to(torch.int64)
    src_start = torch.cumsum(c, 0) - c
    per_rank = c.view(num_ranks, experts_per_rank)
    per_expert = per_rank.sum(0)
    m_sizes = (torch.clamp_min(per_expert, alignment) + (alignment - 1)) // alignment * alignment
    m_offsets = torch.cumsum(m_sizes, 0)
    block_start = m_offsets - m_sizes
    dst_start = (torch.cumsum(per_rank, 0) - per_rank + block_start).reshape(-1)
    return src_start, dst_start, m_sizes, m_offsets


def permute_indices_reference(
    tokens_per_expert_group: torch.Tensor,
    experts_per_rank: int,
    num_ranks: int,
    max_len: int,
    alignment: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(permuted_indices, m_sizes, m_offsets)``; see :func:`dtensor_rules.kernels.moe_permute_indices`.

    Slots at or beyond ``max_len`` are not represented (the op checks that none hold a token).
    """
    counts = tokens_per_expert_group
    check_static_args(counts.shape, counts.dtype, experts_per_rank, num_ranks, max_len, alignment)
    E, R = experts_per_rank, num_ranks
    src_start, _, m_sizes, m_offsets = expert_layout(counts, E, R, alignment)
    c = counts.to(torch.int64)
    per_expert = c.view(R, E).sum(0)

    slot = torch.arange(max_len, dtype=torch.int64, device=counts.device)
    expert = torch.searchsorted(m_offsets, slot, right=True)  # == E past the last block
    e = expert.clamp(max=E - 1)
    pos = slot - (m_offsets - m_sizes)[e]  # row inside expert e's block
    has_token = (expert < E) & (pos < per_expert[e])

    # position of the slot's token in the expert-major stream (e0r0, e0r1, ..., e1r0, ...)
    expert_major = c.view(R, E).t().reshape(-1)
    group_end = torch.cumsum(expert_major, 0)
    stream = (torch.cumsum(per_expert, 0) - per_expert)[e] + pos
    group = torch.searchsorted(group_end, stream, right=True).clamp(max=E * R - 1)  # skips empty groups
    g_expert, g_rank = group // R, group % R
    src = src_start[g_rank * E + g_expert] + stream - (group_end - expert_major)[group]

    permuted = torch.where(has_token, src, torch.full_like(src, -1)).to(INDEX_DTYPE)
    return permuted, m_sizes.to(INDEX_DTYPE), m_offsets.to(INDEX_DTYPE)

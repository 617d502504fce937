"""Row index arithmetic of the two ragged layouts, on one rank's plain tensors.

Everything here is a pure function of the routing matrix ``C`` (``ep x E`` int64: ``C[s][e]``
rows rank ``s`` routes to expert ``e``) and a rank index. The global ragged dim is ``C``'s
segments in ``(e, s)``-major order (partition-major, sender-minor); an unaligned rank ``s`` holds
segments ``(s, e)`` for every ``e``; an aligned rank ``r`` holds the contiguous run of its experts.
The moves (:mod:`dtensor_rules.ragged.ops`) call these per rank; tests never do (their oracle
builds the layouts from Python loops).
"""

from __future__ import annotations

import torch

__all__ = ["exclusive_cumsum", "segment_index", "transpose_index", "rank_sizes", "global_rows_of_rank"]


def exclusive_cumsum(t: torch.Tensor) -> torch.Tensor:
    """``[0, t0, t0+t1, ...]`` (same length as ``t``)."""
    return t.cumsum(0) - t


def segment_index(src_starts: torch.Tensor, lens: torch.Tensor, total: int) -> torch.Tensor:
    """Index that concatenates segments ``[src_starts[i], src_starts[i] + lens[i])`` in order (``total`` rows)."""
    shift = torch.repeat_interleave(src_starts - exclusive_cumsum(lens), lens, output_size=total)
    return shift + torch.arange(total, dtype=shift.dtype, device=shift.device)


def transpose_index(lens: torch.Tensor, total: int) -> torch.Tensor:
    """Index that turns segments laid out ``(a, b)``-major (lengths ``lens``, shape ``(a, b)``) into ``(b, a)``-major."""
    starts = exclusive_cumsum(lens.reshape(-1)).view(lens.shape)
    return segment_index(starts.t().reshape(-1), lens.t().reshape(-1), total)


def rank_sizes(counts: torch.Tensor, aligned: bool) -> torch.Tensor:
    """``(ep,)`` local row counts of each rank's shard in the layout."""
    ep, E = counts.shape
    return counts.sum(0).view(ep, E // ep).sum(1) if aligned else counts.sum(1)


def global_rows_of_rank(counts: torch.Tensor, rank: int, aligned: bool, total: int) -> torch.Tensor:
    """Global row index of each of rank ``rank``'s local rows, in its local order (``total`` = its row count)."""
    ep, E = counts.shape
    if aligned:
        start = rank_sizes(counts, True)[:rank].sum()
        return start + torch.arange(total, dtype=counts.dtype, device=counts.device)
    seg_starts = exclusive_cumsum(counts.t().reshape(-1)).view(E, ep)  # global start of segment (e, s)
    return segment_index(seg_starts[:, rank], counts[rank], total)

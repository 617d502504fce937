"""The MoE index kernel, exposed as a ``torch.library`` custom op with a DTensor rule.

:func:`moe_permute_indices`: token indices grouped by local expert, padded per-expert group
sizes and the ``offs`` of ``torch._grouped_mm`` (Triton on CUDA, torch elsewhere). The
expert-parallel ops (token all-to-alls, routed experts as one op) live in :mod:`dtensor_rules.ep`.
"""

from __future__ import annotations

from torch import Tensor

from dtensor_rules.kernels.moe_index_op import OP_NAME, moe_permute_indices_op
from dtensor_rules.kernels.moe_index_reference import permute_indices_reference, permuted_length_bound
from dtensor_rules.kernels.moe_index_triton import permute_indices_triton, triton_available

__all__ = [
    "moe_permute_indices",
    "moe_permute_indices_op",
    "permuted_length_bound",
    "permute_indices_reference",
    "permute_indices_triton",
    "triton_available",
    "OP_NAME",
]


def moe_permute_indices(
    tokens_per_expert_group: Tensor,
    experts_per_rank: int,
    num_ranks: int,
    max_len: int,
    alignment: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """Where each received token goes in the expert-grouped, padded ``_grouped_mm`` input.

    Args:
        tokens_per_expert_group: int32 or int64, shape ``(num_ranks * experts_per_rank,)``;
            entry ``r * experts_per_rank + e`` is the number of tokens rank ``r`` sent to
            this rank's local expert ``e`` (the layout an all-to-all of per-expert counts
            produces). The received tokens are assumed to sit in that same order in the
            receive buffer ``x`` (rank 0's tokens for expert 0, for expert 1, ..., then
            rank 1's, ...). Without expert parallelism pass ``num_ranks=1``.
        experts_per_rank: local experts ``E`` (>= 1).
        num_ranks: ranks ``R`` that send tokens (>= 1).
        max_len: length of ``permuted_indices``: a static upper bound on
            ``m_offsets[-1]``; ``permuted_length_bound(num_tokens, E, alignment)`` always fits.
        alignment: every group size is rounded up to a multiple of this (e.g. 8/16/32
            rows); an expert with no tokens still gets one ``alignment`` block (>= 1).

    Returns:
        ``(permuted_indices, m_sizes, m_offsets)``, all int32 on the input's device:

        - ``permuted_indices`` ``[max_len]``: slot ``i`` holds the row of ``x`` that goes
          to row ``i`` of the grouped input, or ``-1`` for padding (the tail of each
          expert block and every slot ``>= m_offsets[-1]``). Expert ``e``'s block is
          ``[m_offsets[e] - m_sizes[e], m_offsets[e])``; inside it come rank 0's tokens
          for ``e`` in their original order, then rank 1's, and so on.
        - ``m_sizes`` ``[E]``: ``max(n_e, alignment)`` rounded up to a multiple of
          ``alignment``, where ``n_e`` sums expert ``e``'s counts over ranks.
        - ``m_offsets`` ``[E]``: inclusive cumulative sum of ``m_sizes`` -- the ``offs``
          argument of ``torch._grouped_mm(x_grouped, w, offs=m_offsets)``.

    Use: ``x_grouped = torch.cat([x, x.new_zeros(1, x.shape[1])])[permuted_indices]``
    (``-1`` picks the appended zero row), so the padding inside expert blocks multiplies
    to zeros. Rows at or past ``m_offsets[-1]`` are not computed by ``_grouped_mm`` at
    all (uninitialized memory on CPU in torch 2.13), so the combine must keep only the
    rows with ``permuted_indices >= 0`` and scatter them back to ``permuted_indices``. No device-to-host sync on any device. Raises ``ValueError``
    for bad arguments; negative counts or blocks that overflow ``max_len`` raise on CPU
    and trip a device assert on CUDA. Under DTensor the input must be (and is made)
    Replicate; outputs are Replicate (see ``src/dtensor_rules/op_rules/moe_index.py``).
    """
    return moe_permute_indices_op(tokens_per_expert_group, experts_per_rank, num_ranks, max_len, alignment)

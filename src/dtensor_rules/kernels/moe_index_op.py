"""``torch.ops.dtensor_rules.moe_permute_indices``: the MoE index computation as a custom op.

Why a custom op: a raw Triton launch is opaque to ``make_fx``/``torch.compile`` and to
DTensor. As a ``torch.library.custom_op`` it has a schema, a fake implementation
(output shapes depend only on the static ints, so tracing needs no data), per-device
kernels (CUDA: Triton when installed, else the torch reference; CPU and others: the
torch reference) and a DTensor rule (``src/dtensor_rules/op_rules/moe_index.py``).

Data checks (negative counts, padded tokens that do not fit in ``max_len``) raise
``ValueError`` on CPU; on other devices they are ``torch._assert_async`` device
asserts, so the op never syncs with the host and never returns truncated indices.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dtensor_rules.kernels.moe_index_reference import INDEX_DTYPE, check_static_args, permute_indices_reference
from dtensor_rules.kernels.moe_index_triton import permute_indices_triton, triton_available

__all__ = ["moe_permute_indices_op", "OP_NAME"]

OP_NAME = "dtensor_rules::moe_permute_indices"


def _check_data(counts: Tensor, m_offsets: Tensor, max_len: int) -> None:
    non_negative = (counts >= 0).all()
    fits = m_offsets[-1].to(torch.int64) <= max_len
    if counts.device.type == "cpu":
        if not bool(non_negative):
            raise ValueError(
                f"moe_permute_indices: tokens_per_expert_group has negative counts: {counts.tolist()}"
            )
        if not bool(fits):
            raise ValueError(
                f"moe_permute_indices: the padded expert blocks need {int(m_offsets[-1])} slots but "
                f"max_len={max_len}; raise max_len (permuted_length_bound(num_tokens, experts_per_rank, "
                "alignment) is always enough)"
            )
        return
    torch._assert_async(non_negative, "moe_permute_indices: tokens_per_expert_group has negative counts")
    torch._assert_async(fits, "moe_permute_indices: the padded expert blocks do not fit in max_len")


@torch.library.custom_op(OP_NAME, mutates_args=())
def moe_permute_indices_op(
    tokens_per_expert_group: Tensor,
    experts_per_rank: int,
    num_ranks: int,
    max_len: int,
    alignment: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """Default (CPU and any non-CUDA device) implementation: the torch reference."""
    out = permute_indices_reference(tokens_per_expert_group, experts_per_rank, num_ranks, max_len, alignment)
    _check_data(tokens_per_expert_group, out[2], max_len)
    return out


@moe_permute_indices_op.register_kernel("cuda")
def _cuda(
    tokens_per_expert_group: Tensor, experts_per_rank: int, num_ranks: int, max_len: int, alignment: int
) -> tuple[Tensor, Tensor, Tensor]:
    """CUDA: the Triton kernel when triton is installed (untested on GPU so far), else the reference."""
    impl = permute_indices_triton if triton_available() else permute_indices_reference
    out = impl(tokens_per_expert_group, experts_per_rank, num_ranks, max_len, alignment)
    _check_data(tokens_per_expert_group, out[2], max_len)
    return out


@moe_permute_indices_op.register_fake
def _fake(
    tokens_per_expert_group: Tensor, experts_per_rank: int, num_ranks: int, max_len: int, alignment: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Shapes depend only on the ints: int32[max_len], int32[E], int32[E]."""
    t = tokens_per_expert_group
    check_static_args(t.shape, t.dtype, experts_per_rank, num_ranks, max_len, alignment)
    return (
        t.new_empty((max_len,), dtype=INDEX_DTYPE),
        t.new_empty((experts_per_rank,), dtype=INDEX_DTYPE),
        t.new_empty((experts_per_rank,), dtype=INDEX_DTYPE),
    )

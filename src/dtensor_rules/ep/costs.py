"""Cost formulas of one expert-parallel step on one rank (``dtensor_rules.ep.local``).

The region is not a single op, so these price its parts with the package's conventions
(flops: multiply-adds count 2; bytes of a collective call: the larger of its input and
its output, as ``dtensor_rules.testing.comm.CommBytesMode`` measures them):

===================  ==========================================  ==============================
part                 formula (per rank, forward)                 why
===================  ==========================================  ==============================
count exchange       ``E * 8`` bytes                             one int64 per expert out, in
token dispatch       ``max(sent, received) * D * b`` bytes       rows to / from expert owners
token combine        same as the dispatch                        the transposed all-to-all
local experts        ``6 * rows * D * H_l`` flops                three grouped matmuls over the
                                                                 ``rows = offs[-1]`` padded rows
moe_permute_indices  0 flops (``op_rules/moe_index.py``)          integer prefix sums only
===================  ==========================================  ==============================

Backward: the two token all-to-alls again with the same sizes (transposed), and twice
the expert flops (input and weight gradients of each grouped matmul).
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["EPStepCost", "ep_step_cost"]


class EPStepCost(NamedTuple):
    """Per-rank forward cost of the routed-expert region."""

    count_bytes: int  # the small all-to-all of per-expert counts
    token_bytes: int  # dispatch + combine all-to-alls together
    expert_flops: int  # the three _grouped_mm calls


def ep_step_cost(n_experts: int, rows_sent: int, rows_received: int, padded_rows: int, dim: int,
                 hidden_local: int, itemsize: int) -> EPStepCost:
    """Forward cost on one rank: ``rows_sent = T_l * k``; ``padded_rows = offs[-1]`` of its local experts."""
    token = 2 * max(rows_sent, rows_received) * dim * itemsize
    return EPStepCost(count_bytes=8 * n_experts, token_bytes=token, expert_flops=6 * padded_rows * dim * hidden_local)

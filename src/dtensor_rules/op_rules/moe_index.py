"""``dtensor_rules::moe_permute_indices(counts, E, R, max_len, alignment)`` (the MoE index custom op).

Strategies, per mesh dim ([permuted_indices, m_sizes, m_offsets, counts]):

==========================  ==========  ===================================================
outputs                     counts      why it is valid
==========================  ==========  ===================================================
R, R, R                     R           implied: every rank computes the whole result from
                                        the whole counts (``R * E`` ints: tiny to gather)
==========================  ==========  ===================================================

That is the only layout valid for every input: ``tests/test_moe_index_rule.py`` runs the
ground-truth validator on 1-D and 2-D meshes over several count vectors per shape and
finds no other layout valid on all of them (a single degenerate sample can make one
valid by luck, e.g. counts ``[0]``, alignment 1: Partial(min) pieces 0 and 1 pad alike).
Not offered, and why:

- counts ``S(0)``: every output depends on all counts (``m_offsets`` is a prefix sum
  over experts, each index a prefix sum over groups), and a shard has the wrong length.
- counts ``P(sum/max/min)``: the outputs are not linear or monotone in the counts
  (clamp to one alignment unit, round up, prefix sums, searches); per-rank pieces of a
  Partial count need not be counts at all. Even with a single count (E = R = 1), where
  every output is monotone in it, a ``P(max)`` piece may be negative and a ``P(min)``
  piece may overflow ``max_len``, so the op fails on some rank for some inputs.
- outputs ``S(d)`` from replicated counts: the op has no "which shard" input, so each
  rank would hold the whole output, not its shard.

A Sharded or Partial counts DTensor is therefore redistributed to Replicate first; the
all-gather moves ``R * E`` ints, negligible next to the token all-to-all. Per-EP-rank
counts that differ by rank are local data, not one global tensor: compute them with
``to_local()``/``local_map`` in the MoE block, not through this rule.

Costs: the op is integer index arithmetic (no floating-point operations, ``flops = 0``)
and memory bound: ``bytes`` is its input plus its three int32 outputs.

Samples: uneven counts with empty expert groups, a tight ``max_len`` (no spare slot), three
ranks with alignment 1, int64 counts. No all-zero counts and no single count (E = R = 1): on those
a Partial counts layout can give the right answer by luck (see above), and the validator would
report a layout valid that no rule may offer for every input.
"""

from __future__ import annotations

from typing import Any

import torch

from dtensor_rules.kernels.moe_index_op import moe_permute_indices_op
from dtensor_rules.kernels.moe_index_reference import INDEX_DTYPE
from dtensor_rules.op_rules._common import nbytes, PlacementOrHole, Samples
from dtensor_rules.registry import register

MOE_PERMUTE_INDICES = moe_permute_indices_op._opoverload


# --------------------------------------------------------------------------- sample suites

def _counts(*values: int, dtype: torch.dtype = torch.int32) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def moe_permute_indices_samples() -> Samples:
    # args: (tokens_per_expert_group[R * E], experts_per_rank E, num_ranks R, max_len, alignment)
    return [
        ((_counts(4, 0, 2, 3, 1, 0, 0, 5), 4, 2, 40, 8), {}),  # empty experts, spare slots
        ((_counts(4, 0, 2, 3, 1, 0, 0, 5), 4, 2, 32, 8), {}),  # tight: the padded blocks fill max_len
        ((_counts(2, 5, 0, 1, 3, 4), 2, 3, 20, 1), {}),  # three ranks, alignment 1
        ((_counts(3, 1, 2, 0, 5, 1), 3, 2, 16, 4), {}),  # E=3, R=2: tight max_len (4 + 8 + 4)
        ((_counts(3, 1, 0, 6, 2, 2, dtype=torch.int64), 3, 2, 24, 2), {}),  # int64 counts
    ]


def moe_permute_indices_flops(
    tokens_per_expert_group: torch.Tensor, experts_per_rank: int, num_ranks: int, max_len: int, alignment: int
) -> int:
    """Integer prefix sums and index writes only: no floating-point operations."""
    return 0


def moe_permute_indices_bytes(
    tokens_per_expert_group: torch.Tensor, experts_per_rank: int, num_ranks: int, max_len: int, alignment: int
) -> int:
    """Read the counts once; write ``permuted_indices[max_len]``, ``m_sizes[E]``, ``m_offsets[E]`` (int32)."""
    return nbytes(tokens_per_expert_group) + (max_len + 2 * experts_per_rank) * INDEX_DTYPE.itemsize


@register(
    moe_permute_indices_op, flops=moe_permute_indices_flops, bytes=moe_permute_indices_bytes,
    samples=moe_permute_indices_samples,
)
def moe_permute_indices_strategy(op: Any, args: Any, kwargs: Any) -> list[list[PlacementOrHole]]:
    """Replicate only: every output depends on every count through non-linear prefix sums."""
    return []

"""Sample suites for ``dtensor_rules::moe_permute_indices``: uneven counts with empty expert groups,
a tight ``max_len`` (no spare slot), three ranks with alignment 1, int64 counts.

No all-zero counts and no single count (E = R = 1): on those a Partial counts layout can give
the right answer by luck (see ``src/dtensor_rules/ops/moe_index.py``), and the validator would
report a layout valid that no rule may offer for every input.
"""

from __future__ import annotations

import torch

from dtensor_rules.testing.suites import Samples


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

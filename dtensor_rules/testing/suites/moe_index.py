"""Sample suite for the MoE index custom op ``dtensor_rules::moe_permute_indices`` (so `validate` covers it).

Counts are rank-major ``counts[r * E + e]``; ``max_len`` leaves slack, is tight, or pads zeros.
"""

from __future__ import annotations

import torch

from dtensor_rules.kernels.moe_index_op import moe_permute_indices_op
from dtensor_rules.testing.suites import Samples, suite


@suite(moe_permute_indices_op._opoverload)
def moe_permute_indices_samples() -> Samples:
    def counts(*xs: int) -> torch.Tensor:
        return torch.tensor(xs, dtype=torch.int32)

    return [
        ((counts(4, 0, 2, 3, 1, 0, 0, 5), 4, 2, 40, 8), {}),  # E=4, R=2: padded total 32, slack 8
        ((counts(3, 1, 2, 0, 5, 1), 3, 2, 16, 4), {}),  # E=3, R=2: tight max_len (4 + 8 + 4)
        ((counts(0, 0, 0, 0), 2, 2, 12, 4), {}),  # no tokens: every expert padded to one alignment unit
        ((counts(7), 1, 1, 8, 1), {}),  # a single count
    ]

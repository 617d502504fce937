"""Sample suites for cumsum: Partial-carrying dtypes, int promotion, dtype=, in place."""

from __future__ import annotations

import torch

from dtensor_rules.testing.suites import Samples, generator


def cumsum_samples() -> Samples:
    g = generator(10)
    counts = torch.randint(0, 9, (8,), generator=g)  # tokens per expert -> offsets
    return [
        ((torch.randn(5, 4, 3, generator=g), 1), {}),
        ((counts, 0), {}),  # int64 -> int64: P(sum) exact
        ((torch.randint(-5, 6, (3, 5), generator=g, dtype=torch.int32), 1), {}),  # int32 -> int64
        ((torch.randn(4, 6, generator=g).to(torch.bfloat16), -1), {}),
        ((torch.randn(6, 3, generator=g), 0), {"dtype": torch.float64}),  # wider result
        ((torch.randint(0, 4, (5, 3), generator=g), 0), {"dtype": torch.float32}),  # int -> float
        ((torch.randn(3, 5, generator=g).double(), 1), {"dtype": torch.float32}),  # narrower result
    ]


def cumsum_inplace_samples() -> Samples:
    g = generator(11)
    return [
        ((torch.randn(5, 3, generator=g), 0), {}),
        ((torch.randint(-3, 4, (4, 5), generator=g, dtype=torch.int32), 1), {}),  # int32 in place: exact
        ((torch.randn(4, 6, generator=g).to(torch.bfloat16), -1), {}),
    ]

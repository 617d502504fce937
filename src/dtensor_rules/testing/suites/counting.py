"""Sample suites for histc and bincount (tokens per expert), fixed and data-derived ranges."""

from __future__ import annotations

import torch

from dtensor_rules.testing.suites import Samples, generator


def histc_samples() -> Samples:
    g = generator(20)
    expert_ids = torch.randint(0, 8, (7, 2), generator=g).float()  # top-2 expert ids per token
    return [
        ((expert_ids, 8, 0, 7), {}),  # MoE tokens-per-expert
        ((torch.randn(5, 4, generator=g), 6, -1.5, 1.5), {}),  # values outside the range too
        ((torch.randn(3, 5, generator=g).to(torch.bfloat16), 4, -1, 1), {}),
        ((torch.randn(6, generator=g), 5, 2, 2), {}),  # min == max != 0: data range, upstream wrong
        ((torch.randn(4, 3, generator=g), 5), {}),  # defaults: data range
        ((torch.randn(5, 3, generator=g),), {"bins": 3, "min": -1, "max": 1}),  # by keyword
    ]


def bincount_samples() -> Samples:
    g = generator(21)
    ids = torch.randint(0, 6, (9,), generator=g)
    return [
        ((ids,), {}),
        ((ids, torch.rand(9, generator=g)), {}),  # gate-weighted counts
        ((ids, torch.randn(9, generator=g).to(torch.bfloat16), 8), {}),  # float64 result, minlength
        ((ids,), {"weights": torch.randn(9, generator=g).double(), "minlength": 3}),
        ((ids, torch.randint(0, 4, (9,), generator=g)), {}),  # int weights -> float64
    ]

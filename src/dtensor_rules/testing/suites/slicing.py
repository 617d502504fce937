"""Sample suites for cat and slice_scatter: uneven sizes, legacy empty inputs, negative dims,
clamped / negative / None bounds, step > 1, empty and full slices, bf16 and int64."""

from __future__ import annotations

import torch

from dtensor_rules.testing.suites import Samples, generator


def _rand(seed: int):  # noqa: ANN202 - tiny local factory
    g = generator(seed)

    def r(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        if dtype.is_floating_point:
            return torch.randn(*shape, generator=g).to(dtype)
        return torch.randint(-5, 6, shape, generator=g, dtype=dtype)

    return r


def cat_samples() -> Samples:
    r = _rand(10)
    return [
        (([r(4, 3), r(4, 5)], 1), {}),  # different sizes on the cat dim
        (([r(5, 3), r(2, 3), r(3, 3)], -2), {}),  # three inputs, negative dim, uneven
        (([r(3, 4), torch.zeros(0), r(3, 2)], -1), {}),  # legacy empty input is skipped
        (([r(0, 6), r(5, 6)], 0), {}),  # one input empty on the cat dim: the cat dim may shard
        (([r(2, 3, 5, dtype=torch.bfloat16), r(2, 1, 5, dtype=torch.bfloat16)], 1), {}),
        (([r(6, 2, dtype=torch.int64), r(6, 3, dtype=torch.int64)], 1), {}),
    ]


def slice_scatter_samples() -> Samples:
    r = _rand(11)
    return [
        ((r(4, 6), r(4, 2), 1, 1, 5, 2), {}),  # step 2
        ((r(5, 6), r(5, 3), -1, -3, None), {}),  # negative start, end None
        ((r(6, 3), r(6, 3), 0, -10, 100), {}),  # clamped bounds: full slice, out == src
        ((r(5, 6), r(5, 0), 1, 4, 2), {}),  # empty slice, out == self
        ((r(7, 4, dtype=torch.bfloat16), r(3, 4, dtype=torch.bfloat16), 0, 2, 5), {}),
        ((r(5, 4, dtype=torch.int64), r(5, 2, dtype=torch.int64), 1, 0, 4, 3), {}),
    ]

"""Sample suites for aten._grouped_mm: all four modes, fp32 and bf16, uneven groups, an empty group,
uneven M, a column-major (transposed) weight as the backward produces.

``offs[-1]`` always equals the grouped length: rows/columns past it are left uninitialized by
the kernel, so a single-device result there is not defined.
"""

from __future__ import annotations

import torch

from dtensor_rules.testing.suites import Samples, generator


def _offs(*ends: int) -> torch.Tensor:
    return torch.tensor(ends, dtype=torch.int32)


def grouped_mm_samples() -> Samples:
    g = generator(20)
    r = lambda *s, dtype=torch.float32: torch.randn(*s, generator=g).to(dtype)  # noqa: E731
    bf = torch.bfloat16
    return [
        ((r(12, 8), r(3, 8, 8), _offs(3, 7, 12)), {}),  # 2-D x 3-D, M grouped
        ((r(12, 8), r(3, 8, 8), _offs(4, 4, 12)), {}),  # an empty group
        ((r(3, 6, 8), r(8, 12), _offs(4, 8, 12)), {}),  # 3-D x 2-D, N grouped
        ((r(6, 16, dtype=bf), r(16, 8, dtype=bf), _offs(5, 16)), {}),  # 2-D x 2-D, K grouped
        ((r(4, 5, 16, dtype=bf), r(4, 16, 8, dtype=bf)), {}),  # 3-D x 3-D batched, uneven M
        ((r(2, 3, 12), r(2, 8, 12).transpose(-2, -1)), {}),  # column-major weight
    ]

"""Sample suites for prims.fma, _softmax_backward_data and the identity-layout ops (uneven shapes, broadcasting, bf16)."""

from __future__ import annotations

import torch

from dtensor_rules.testing.suites import Samples, generator


def fma_samples() -> Samples:
    g = generator(0)
    r = lambda *s, dtype=torch.float32: torch.randn(*s, generator=g).to(dtype)  # noqa: E731
    return [
        ((r(4, 6), r(4, 6), r(4, 6)), {}),
        ((r(5, 3), r(5, 3), r(3)), {}),  # broadcast addend, uneven dim 0
        ((r(4, 1), r(1, 6), r(4, 6)), {}),  # outer-product broadcasting
        ((r(3, 4, 5, dtype=torch.bfloat16), r(3, 4, 5, dtype=torch.bfloat16), r(5, dtype=torch.bfloat16)), {}),
    ]


def softmax_backward_samples() -> Samples:
    g = generator(1)
    out = []
    for shape, dim, dtype in (((4, 6), -1, torch.float32), ((5, 3, 4), 1, torch.float32), ((3, 8), 0, torch.bfloat16)):
        y = torch.randn(*shape, generator=g).softmax(dim).to(dtype)
        grad = torch.randn(*shape, generator=g).to(dtype)
        out.append(((grad, y, dim, dtype), {}))
    return out


def identity_samples() -> Samples:
    g = generator(2)
    return [
        ((torch.randn(5, 3, generator=g),), {}),
        ((torch.randn(3, 4, 2, generator=g).to(torch.bfloat16),), {}),
        ((torch.randint(0, 9, (7,), generator=g),), {}),
    ]

"""Sample suites for torchtitan's custom ops (``dtensor_rules.ops.torchtitan_ops``): uneven row
counts, duplicate indices, bf16, offsets that stop before the last row (rows past ``offsets[-1]``
are unwritten by the CUDA kernel; the CPU reference kernel of tests/test_torchtitan_ops.py zeroes
them)."""

from __future__ import annotations

import torch

from dtensor_rules.testing.suites import Samples, generator


def _r(g: torch.Generator, *shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=g).to(dtype)


def deterministic_scatter_add_samples() -> Samples:
    """The MoE combine: (T, D) zeros, (N, D) token ids expanded over D, (N, D) weighted expert rows."""
    g = generator(60)
    out = []
    for T, N, D, dtype in ((5, 10, 6, torch.float32), (7, 9, 4, torch.bfloat16), (3, 5, 3, torch.float32)):
        ids = torch.randint(0, T, (N, 1), generator=g).expand(N, D).contiguous()
        out.append(((_r(g, T, D, dtype=dtype), ids, _r(g, N, D, dtype=dtype)), {}))
    return out


def silu_and_mul_samples() -> Samples:
    g = generator(61)
    return [
        ((_r(g, 5, 6), _r(g, 5, 6)), {}),
        # a small gate: the validator's P(max) pieces sit (2 span + 1) below it, and silu of a large
        # negative number is ~0, which would let a wrong (P(max) gate -> P(sum)) claim pass in bf16
        ((_r(g, 7, 4, dtype=torch.bfloat16) * 0.2, _r(g, 7, 4, dtype=torch.bfloat16)), {}),
        ((_r(g, 6, 5), _r(g, 6, 5), torch.tensor([2, 4], dtype=torch.int32)), {}),  # rows 4, 5 not computed
    ]


def silu_and_mul_backward_samples() -> Samples:
    g = generator(62)
    return [
        ((_r(g, 5, 6), _r(g, 5, 6), _r(g, 5, 6)), {}),
        ((_r(g, 7, 4, dtype=torch.bfloat16), _r(g, 7, 4, dtype=torch.bfloat16) * 0.2, _r(g, 7, 4, dtype=torch.bfloat16)), {}),
        ((_r(g, 6, 5), _r(g, 6, 5), _r(g, 6, 5), torch.tensor([3, 5], dtype=torch.int32)), {}),
    ]

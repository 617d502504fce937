"""Sample suites for torchtitan's custom ops (``dtensor_rules.ops.torchtitan_ops``): uneven row
counts, duplicate indices, bf16, offsets that stop before the last row (rows past ``offsets[-1]``
are unwritten by the CUDA kernel; the CPU reference kernel of tests/test_torchtitan_ops.py zeroes
them)."""

from __future__ import annotations

from collections.abc import Callable

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


def _rope_inputs(g: torch.Generator, B: int, L: int, rope: int, max_pos: int = 9) -> tuple[torch.Tensor, torch.Tensor]:
    """A (max_pos, rope/2, 2) cos/sin cache of real angles and (B, L) positions into it."""
    angles = torch.rand(max_pos, rope // 2, generator=g) * 6.3
    cache = torch.stack([angles.cos(), angles.sin()], dim=-1)
    return cache, torch.randint(0, max_pos, (B, L), generator=g)


def fused_mla_k_rope_samples() -> Samples:
    g = generator(63)
    out = []
    for B, L, H, nope, V, rope, dtype in ((3, 5, 4, 4, 6, 4, torch.float32), (2, 3, 3, 2, 2, 6, torch.bfloat16)):
        cache, pos = _rope_inputs(g, B, L, rope)
        out.append(((_r(g, B, L, H, nope + V, dtype=dtype), _r(g, B, L, rope, dtype=dtype), cache, pos, nope), {}))
    return out


def fused_mla_kv_backward_samples() -> Samples:
    g = generator(64)
    out = []
    for B, L, H, nope, V, rope, dtype in ((3, 5, 4, 4, 6, 4, torch.float32), (2, 3, 3, 2, 2, 6, torch.bfloat16)):
        cache, pos = _rope_inputs(g, B, L, rope)
        out.append(((_r(g, B, L, H, nope + rope, dtype=dtype), _r(g, B, L, H, V, dtype=dtype), cache, pos, nope, rope), {}))
    return out


def fused_mla_q_rope_samples() -> Samples:
    """q (B, L, H, nope + rope), rotated forward (fp32) and back (bf16, the backward's use)."""
    g = generator(65)
    out = []
    for B, L, H, nope, rope, dtype, inverse in ((3, 5, 4, 4, 4, torch.float32, False),
                                                (2, 3, 3, 2, 6, torch.bfloat16, True)):
        cache, pos = _rope_inputs(g, B, L, rope)
        out.append(((_r(g, B, L, H, nope + rope, dtype=dtype), cache, pos, nope, inverse), {}))
    return out


def _helion_samples(seed: int, cache_of: Callable[[torch.Tensor], torch.Tensor]) -> Samples:
    """(xq, xk, cache, positions): more q heads than k heads (GQA), fp32 and bf16, odd sizes."""
    g = generator(seed)
    out = []
    for B, L, H, Hk, D, dtype in ((3, 5, 4, 2, 8, torch.float32), (2, 3, 3, 1, 4, torch.bfloat16)):
        angles = torch.rand(9, D // 2, generator=g) * 6.3
        pos = torch.randint(0, 9, (B, L), generator=g)
        out.append(((_r(g, B, L, H, D, dtype=dtype), _r(g, B, L, Hk, D, dtype=dtype), cache_of(angles), pos), {}))
    return out


def helion_cossin_rope_samples() -> Samples:
    """The cossin cache: (M, 2D), cos then sin, each half repeated (rotate-half's layout)."""
    return _helion_samples(66, lambda a: torch.cat([a.cos(), a.cos(), a.sin(), a.sin()], dim=-1))


def helion_complex_rope_samples() -> Samples:
    """The complex cache: view_as_real of (M, D/2) unit complex numbers, (M, D/2, 2)."""
    return _helion_samples(67, lambda a: torch.stack([a.cos(), a.sin()], dim=-1))

"""The demo's MoE block, its tokens and its tolerance: shared by ``demo``, ``demo_ep`` and ``coverage``.

A module of its own so the three faces that show the same model import it from here and
never each other (no import circle between demo, demo_ep and coverage).
"""

from __future__ import annotations

import dataclasses

import torch

from dtensor_rules.models.moe import MoE, MoEConfig

__all__ = ["DEMO_CONFIG", "TOKENS", "TOL", "demo_model", "demo_inputs", "within_tolerance"]

DEMO_CONFIG = MoEConfig(dim=32, hidden=64, n_experts=4, top_k=2, n_shared=1)
TOKENS = (66, 32)  # 66 tokens: 33 per "ep" rank, split 17/16 where "tp" shards them (uneven)
TOL = {torch.float32: "1e-5 (abs and rel)", torch.bfloat16: "2 bf16 ulps of the largest |value|"}


def demo_model(dtype: torch.dtype, permute_impl: str = "torch", seed: int = 1) -> MoE:
    """The demo's MoE block with deterministic weights."""
    model = MoE(dataclasses.replace(DEMO_CONFIG, permute_impl=permute_impl), dtype=dtype)
    model.init_weights(seed)
    return model


def demo_inputs(dtype: torch.dtype, shape: tuple[int, ...] = TOKENS) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens and the cotangent for backward (float32 draws cast to ``dtype``: same values for every dtype)."""
    x = torch.randn(shape, generator=torch.Generator().manual_seed(3)).to(dtype)
    cot = torch.randn(shape, generator=torch.Generator().manual_seed(7)).to(dtype)
    return x, cot


def within_tolerance(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> bool:
    """float32: 1e-5 abs and rel; bf16: 2 ulps (2 * 2**-7) of the largest |value| abs, 2% rel."""
    if dtype == torch.float32:
        atol, rtol = 1e-5, 1e-5
    else:
        atol, rtol = 2 * 2**-7 * want.abs().max().item(), 2e-2
    try:
        torch.testing.assert_close(got.float(), want.float(), atol=atol, rtol=rtol)
    except AssertionError:
        return False
    return True

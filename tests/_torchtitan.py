"""torchtitan (the optional ``[torchtitan]`` extra) for the tests that target it.

:func:`require_torchtitan` skips a test where torchtitan is not installed, EXCEPT under CI
(``CI`` set, or ``EXTRAS`` naming torchtitan, as ``.ci/run`` does): CI installs the extra, so
there a missing torchtitan is an install failure and the test fails instead of vanishing.
"""

from __future__ import annotations

import importlib
import os

import pytest
import torch


def torchtitan_required() -> bool:
    return bool(os.environ.get("CI")) or "torchtitan" in os.environ.get("EXTRAS", "").split(",")


def require_torchtitan(module: str = "torchtitan.models.common.moe"):
    """Import ``module`` of torchtitan: ImportError under CI, a skip elsewhere."""
    if torchtitan_required():
        return importlib.import_module(module)
    return pytest.importorskip(module, reason="the [torchtitan] extra is not installed (CI installs it)")


def require_helion_rope():
    """torchtitan's helion rope module with its ops defined (they need helion, part of the extra):
    ImportError under CI, a skip elsewhere."""
    hr = require_torchtitan("torchtitan.overrides.helion_rope")
    if hr._HELION_IMPORT_ERROR is not None:
        if torchtitan_required():
            raise hr._HELION_IMPORT_ERROR
        pytest.skip(f"helion is not installed ({hr._HELION_IMPORT_ERROR}); the [torchtitan] extra installs it")
    return hr


def torchtitan_moe(dim: int = 16, hidden: int = 32, n_experts: int = 8, top_k: int = 2, *, score_func: str = "softmax",
                   route_norm: bool = True, route_scale: float = 1.0, shared: bool = True, seed: int = 0,
                   bias_hot: int | None = None, meta: bool = False):
    """A torchtitan 0.3.0 DeepSeek-V3-style ``MoE`` (its own classes and configs), seeded weights and
    a small expert bias (``bias_hot``: that expert gets +10, so every token picks it).

    ``meta=True``: built under ``torch.device("meta")`` as torchtitan's trainer builds its model,
    so no tensor holds values."""
    moe = require_torchtitan()
    from torchtitan.models.common.feed_forward import FeedForward
    from torchtitan.models.common.linear import Linear
    from torchtitan.models.common.token_dispatcher import LocalTokenDispatcher

    def lin(i: int, o: int):
        return Linear.Config(in_features=i, out_features=o)

    cfg = moe.MoE.Config(
        num_experts=n_experts,
        routed_experts=moe.RoutedExperts.Config(
            inner_experts=moe.GroupedExperts.Config(dim=dim, hidden_dim=hidden, num_experts=n_experts),
            token_dispatcher=LocalTokenDispatcher.Config(num_experts=n_experts, top_k=top_k)),
        router=moe.TokenChoiceTopKRouter.Config(num_experts=n_experts, gate=lin(dim, n_experts), top_k=top_k,
                                                score_func=score_func, route_norm=route_norm, route_scale=route_scale),
        shared_experts=FeedForward.Config(w1=lin(dim, hidden), w2=lin(hidden, dim), w3=lin(dim, hidden)) if shared else None,
    )
    if meta:
        with torch.device("meta"):
            return cfg.build()
    m = cfg.build()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * p.shape[-1] ** -0.5)
        bias = torch.randn(n_experts, generator=g) * 0.05
        if bias_hot is not None:
            bias[bias_hot] = 10.0
        m.expert_bias_E.copy_(bias)
    return m


__all__ = ["torchtitan_required", "require_torchtitan", "require_helion_rope", "torchtitan_moe"]

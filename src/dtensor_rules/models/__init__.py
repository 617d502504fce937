"""The reference MoE block the rules are exercised on end to end (a DeepSeekV3-style MoE block).

- :class:`MoE` / :class:`MoEConfig`: the block (router, routed experts as grouped matmuls, shared experts);
- :func:`shard_moe`: experts on "ep" under plain DTensor rules (DTensor gathers experts and tokens);
- :func:`add_balance_loss`: the optional load-balancing loss on torchtitan's MoE (ours has it in ``MoEConfig``).

True expert parallelism (tokens by all-to-all) is :func:`dtensor_rules.ep.expert_parallel`.
"""

from dtensor_rules.models.balance_hook import add_balance_loss
from dtensor_rules.models.moe import MoE, MoEConfig, alignment_for, shard_moe

__all__ = ["MoE", "MoEConfig", "alignment_for", "shard_moe", "add_balance_loss"]

# expert parallelism is its own package; the old import path answers with the new one instead of an alias
_IN_EP = frozenset({"expert_parallel", "token_placements", "expert_param_bytes"})


def __getattr__(name: str) -> object:
    if name in _IN_EP:
        # ImportError, not AttributeError: ``from ... import`` replaces an AttributeError's message by its own
        raise ImportError(f"dtensor_rules.models.{name} is in the expert-parallel package: "
                          f"from dtensor_rules.ep import {name}")
    raise AttributeError(f"module 'dtensor_rules.models' has no attribute {name!r}")

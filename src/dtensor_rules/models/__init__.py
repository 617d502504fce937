"""The reference MoE block the rules are exercised on end to end (a DeepSeekV3-style MoE block).

- :class:`MoE` / :class:`MoEConfig`: the block (router, routed experts as grouped matmuls, shared experts);
- :func:`shard_moe`: experts on "ep" under plain DTensor rules (DTensor gathers experts and tokens);
- :func:`add_balance_loss`: the optional load-balancing loss on torchtitan's MoE (ours has it in ``MoEConfig``).

True expert parallelism (tokens by all-to-all) is :func:`dtensor_rules.ep.expert_parallel`.
"""

from dtensor_rules.models.balance_hook import add_balance_loss
from dtensor_rules.models.moe import MoE, MoEConfig, alignment_for, shard_moe

__all__ = ["MoE", "MoEConfig", "alignment_for", "shard_moe", "add_balance_loss"]

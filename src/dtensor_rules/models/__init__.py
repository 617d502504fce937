"""Small reference models used to exercise the rules end to end (e.g. a DeepSeekV3-style MoE block).

- :func:`shard_moe`: experts on "ep" under plain DTensor rules (DTensor gathers experts and tokens);
- :func:`expert_parallel`: true expert parallelism, tokens by all-to-all (docs/expert_parallel.md);
- :func:`add_balance_loss`: the optional load-balancing loss on torchtitan's MoE (ours has it in ``MoEConfig``).
"""

from dtensor_rules.models.balance_hook import add_balance_loss
from dtensor_rules.models.expert_parallel import expert_param_bytes, expert_parallel, token_placements
from dtensor_rules.models.moe import MoE, MoEConfig, alignment_for, shard_moe

__all__ = ["MoE", "MoEConfig", "alignment_for", "shard_moe", "expert_parallel", "token_placements", "expert_param_bytes",
           "add_balance_loss"]

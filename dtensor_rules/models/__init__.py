"""Small reference models used to exercise the rules end to end (e.g. a DeepSeekV3-style MoE block)."""

from dtensor_rules.models.moe import MoE, MoEConfig, alignment_for, shard_moe

__all__ = ["MoE", "MoEConfig", "alignment_for", "shard_moe"]

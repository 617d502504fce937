"""``moe_permute_indices`` on a ragged DTensor: refused, naming the fix (no ragged rule applies).

The op's input is ``tokens_per_expert_group``: the ``(R * E_l,)`` counts THIS rank received from each
sender for each of its local experts -- per-rank local data (what ``expert_parallel``'s region computes
from its counts all-to-all), not rows of a global tensor. A ``RaggedShard`` DTensor holds assignment rows
(ids, tokens), so passing one is a mix-up, and there is nothing to lift: the op's only valid layout is
``Replicate`` (``ops/moe_index.py``: every output depends on every count through prefix sums), which would
gather the ragged rows. On the placements path the op is not needed at all: the dispatch
(``RaggedShard(aligned=True)``) already delivers each rank's rows grouped per local expert (partition-major,
sender-minor: the order the op computes), and ``_grouped_mm`` takes the global group ends
``counts.sum(0).redistribute(Replicate).cumsum(0)`` (``models/ragged_moe.py``). So the rule raises; the
fixes it names: that path, the op on plain per-rank counts, or ``x.full_tensor()`` first for the
single-device answer on the gathered vector.
"""

from __future__ import annotations

from typing import Any, NoReturn

from dtensor_rules.kernels.moe_index_op import moe_permute_indices_op
from dtensor_rules.ragged.rulekit import ragged_operand, refuse
from dtensor_rules.ragged.table import ragged_rule

__all__ = ["ragged_moe_permute_indices"]


@ragged_rule(moe_permute_indices_op._opoverload)
def ragged_moe_permute_indices(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> NoReturn:
    """Refuse (module docstring)."""
    x = args[0] if args else kwargs["tokens_per_expert_group"]
    ragged_operand(op, x)
    raise refuse(
        op, [x], "its input is this rank's received counts per (sender, local expert), local data, not ragged rows",
        "On the RaggedShard path it is not needed: dispatch to RaggedShard(0, E, aligned=True) (rows already grouped "
        "per local expert) and pass _grouped_mm offs = counts.sum(0).redistribute(mesh, [Replicate()]).cumsum(0); "
        "otherwise call it on plain per-rank counts (e.g. ragged.context_of(rows).recv_counts after a dispatch), or "
        "on x.full_tensor() for the single-device result of the gathered vector")

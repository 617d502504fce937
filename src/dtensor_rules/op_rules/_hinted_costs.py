"""Compiled DTensor code propagates shardings at concrete-size speed: the ``hinted_strategy_costs`` patch.

Not an op rule: upstream's strategy expansion prices ~60 candidates per op with sympy arithmetic
when sizes are symbolic (``_upstream/hinted_costs.py`` says why pricing on the sizes' hints is
valid). Optional and on by default: it changes only which correct strategy is picked for an
unbacked size and which guards a tie records, never a result, and it halves the sharding
propagation of a compiled MoE block (docs/compile.md, "Compile time").
"""

from __future__ import annotations

from dtensor_rules._upstream import price_on_hints, price_symbolically
from dtensor_rules.patches import Patch, register

register(Patch(
    name="hinted_strategy_costs",
    apply=price_on_hints,
    restore=price_symbolically,
    changes="torch.distributed.tensor._ops.utils.redistribute_cost (the name upstream's strategy expansion "
    "prices candidates with): a spec with symbolic sizes is priced on their hints (unbacked: 8192), memoized",
    reason="under torch.compile(dynamic=True) upstream prices every candidate strategy in sympy: mm spent 0.75 s "
    "per call in sharding propagation; on hints the same choice costs a third (compile time only)",
    upstream="missing: torch.distributed.tensor._ops.utils.redistribute_cost has no concrete-size path for a spec "
    "with symbolic sizes: it prices in sympy and returns a symbolic cost (checked: torch 2.13.0, 2.14.1)",
    required=False,
    default=True,
))

"""What compiled DTensor code needs beyond the rules, whichever rule is active: two named patches.

- ``first_symbol_record`` (required): AOTAutograd's tracer can loop forever on sizes that DTensor's
  sharding propagation recomputes (``_upstream/tracing.py`` explains the defect and why keeping the
  first record is correct). Without it the MoE block of :mod:`dtensor_rules.models` under
  ``torch.compile(dynamic=True)`` fails with ``RecursionError`` on torch 2.13 and 2.14, with our
  rules or upstream's; ``tests/test_moe_compile.py`` is the proof.
- ``hinted_strategy_costs`` (optional, on by default): upstream's strategy expansion prices ~60
  candidates per op with sympy arithmetic when sizes are symbolic (``_upstream/hinted_costs.py``
  says why pricing on the sizes' hints is valid). It changes only which correct strategy is picked
  for an unbacked size and which guards a tie records, never a result, and it halves the sharding
  propagation of a compiled MoE block (docs/compile.md, "Compile time").
"""

from __future__ import annotations

from dtensor_rules._upstream import (
    keep_first_symbol_record,
    price_on_hints,
    price_symbolically,
    restore_symbol_record,
)
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

register(Patch(
    name="first_symbol_record",
    apply=keep_first_symbol_record,
    restore=restore_symbol_record,
    changes="torch.fx.experimental.proxy_tensor._init_proxy_trackers: every tracer created while applied "
    "(make_fx, AOTAutograd, torch.compile) keeps the first proxy recorded per sympy symbol",
    reason="torch.compile(dynamic=True) of DTensor code (the MoE block, upstream's rules too) dies with "
    "RecursionError in the joint-graph trace without it (tests/test_moe_compile.py)",
    upstream="defect: proxy_tensor's sympy_expr_tracker keeps the LAST proxy recorded per sympy symbol, so DTensor's "
    "recomputed local sizes can form a proxy cycle: RecursionError tracing the joint graph (checked: torch 2.13.0, 2.14.1)",
    required=True,
))

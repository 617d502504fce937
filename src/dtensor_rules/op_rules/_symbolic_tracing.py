"""Compiled DTensor code traces without a proxy cycle: the ``first_symbol_record`` patch.

Not an op rule: AOTAutograd's tracer can loop forever on sizes that DTensor's sharding
propagation recomputes (``_upstream/tracing.py`` explains the defect and why keeping the first
record is correct). Without it the MoE block of :mod:`dtensor_rules.models` under
``torch.compile(dynamic=True)`` fails with ``RecursionError`` on torch 2.13 and 2.14, with our
rules or upstream's; ``tests/test_moe_compile.py`` is the proof.
"""

from __future__ import annotations

from dtensor_rules._upstream import keep_first_symbol_record, restore_symbol_record
from dtensor_rules.patches import Patch, register

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

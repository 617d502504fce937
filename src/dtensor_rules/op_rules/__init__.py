"""Op-family rule modules, one file per family (strategies, cost formula, sample suite).
Importing this package registers every shipped rule, expert parallelism's two ops included."""

from dtensor_rules.op_rules import (  # noqa: F401
    counting,
    fma,
    gather_scatter,
    grouped_mm,
    identity,
    indexing,
    moe_index,
    scan,
    slicing,
    softmax,
    sorting,
    torchtitan_ops,
)
from dtensor_rules.ep import all_to_all_rule, routed_experts_rule  # noqa: F401  (expert parallelism's ops)

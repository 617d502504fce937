"""Op-family rule modules. Importing this package registers every shipped rule (and
``_symbolic_tracing``'s patch, which compiled code needs whichever rule is active,
and ``_hinted_costs``'s, which speeds up compiling whichever rule is active)."""

from dtensor_rules.op_rules import (  # noqa: F401
    _hinted_costs,
    _symbolic_tracing,
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

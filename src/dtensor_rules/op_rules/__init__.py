"""Op-family rule modules. Importing this package registers every shipped rule (and
``_symbolic_tracing``'s patch, which compiled code needs whichever rule is active,
and ``_hinted_costs``'s, which speeds up compiling whichever rule is active)."""

from dtensor_rules.op_rules import (  # noqa: F401
    _hinted_costs,
    _symbolic_tracing,
    counting,
    ep_all_to_all,
    fma,
    gather_scatter,
    grouped_mm,
    identity,
    indexing,
    moe_index,
    routed_experts,
    scan,
    slicing,
    softmax,
    sorting,
    torchtitan_ops,
)

"""Expert parallelism: an MoE block's routed experts split over an "ep" mesh dim, tokens by all-to-all.

- :func:`expert_parallel` (:mod:`.expert_parallel`): the region that makes a block expert-parallel
  (ours, torchtitan's, or one an adapter describes: :mod:`.adapters`, checked by :mod:`.checks`);
  :func:`token_placements`, :func:`expert_param_bytes`; docs/expert_parallel.md.
- :mod:`.local`: what one rank runs (dispatch, local grouped matmuls, combine);
- the custom ops and their DTensor rules: ``dtensor_rules::ep_dispatch`` / ``ep_combine``
  (:mod:`.all_to_all`, rule :mod:`.all_to_all_rule`) and ``dtensor_rules::routed_experts``
  (:mod:`.routed_experts_op`, rule :mod:`.routed_experts_rule`; :func:`routed_experts_as_op` puts
  it in a block, :mod:`.routed_op`), so a solver is offered expert parallelism as a row;
- :mod:`.costs`: what each step of the EP path costs.

The names load at first use: ``import dtensor_rules`` registers the two rules (and so defines
their ops) without loading the region and the model code it needs.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOME = {
    "expert_parallel": "expert_parallel", "token_placements": "expert_parallel",
    "expert_param_bytes": "expert_parallel", "routed_experts_as_op": "routed_op",
}
__all__ = list(_HOME)


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME))

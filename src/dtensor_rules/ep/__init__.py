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
"""

from dtensor_rules.ep.expert_parallel import expert_param_bytes, expert_parallel, token_placements
from dtensor_rules.ep.routed_op import routed_experts_as_op

__all__ = ["expert_parallel", "token_placements", "expert_param_bytes", "routed_experts_as_op"]

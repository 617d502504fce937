"""Expert parallelism as DTensor placements: ``RaggedShard`` and its moves (issue 19, stage 2).

``RaggedShard(dim, E, aligned)`` is a ``Shard`` subclass holding structure only; the sizes (the
``ep x E`` routing matrix) travel as a tensor in a :class:`RaggedContext`. The moves:

- :func:`dispatch` unaligned -> aligned (counts all-to-all, token all-to-all), :func:`combine`
  back; each is the other's backward;
- :func:`gather` either -> Replicate (all-gather with sizes), :func:`distribute` Replicate /
  a full tensor -> either (a local select);
- :func:`redistribute` any of these by placements (also what ``x.redistribute`` and
  ``x.full_tensor()`` run while the ``ragged_redistribute`` patch is on).

docs/expert_parallel.md ("Expert parallelism as placements") shows the layouts.
"""

from dtensor_rules.ragged.placement import RaggedShard, is_ragged
from dtensor_rules.ragged.context import RaggedContext, attach, context_of, counts_from_local
from dtensor_rules.ragged.moves import combine, dispatch, distribute, gather, redistribute
from dtensor_rules.ragged.permute import Permutation, permute, unpermute
from dtensor_rules.ragged.route import route
from dtensor_rules.ragged import patch as _patch  # noqa: F401  (registers the named patches)
from dtensor_rules.ragged import counting as _counting, indexing as _indexing, sorting as _sorting, views as _views  # noqa: F401,E501  (rules)
from dtensor_rules.ragged import permute_indices as _permute_indices  # noqa: F401  (refuses moe_permute_indices)

__all__ = ["RaggedShard", "RaggedContext", "is_ragged", "attach", "context_of", "counts_from_local",
           "dispatch", "combine", "gather", "distribute", "redistribute", "permute", "unpermute", "Permutation", "route"]

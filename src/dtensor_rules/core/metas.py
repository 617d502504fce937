"""The ``TensorMeta`` leaves of a single-dim rule's arguments, in order.

Shared by the rules (``dtensor_rules.op_rules``) and the registry's check of their output; it lives
outside ``ops`` because the registry must not import the op modules.
"""

from __future__ import annotations

from typing import Any

from torch.utils._pytree import tree_leaves

from dtensor_rules._upstream import TensorMeta


def metas(args: Any) -> list[TensorMeta]:
    # TensorMeta is a NamedTuple: stop pytree from flattening it into its fields
    return [m for m in tree_leaves(args, is_leaf=lambda x: isinstance(x, TensorMeta)) if isinstance(m, TensorMeta)]

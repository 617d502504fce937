"""Upstream's spec, schema and strategy classes under stable public names.

They are plain re-exports: the names our code uses stay the same when upstream moves or
renames a class (add a version-keyed import here).
"""

from torch.distributed.tensor._decompositions import DecompShardingStrategy
from torch.distributed.tensor._dtensor_spec import DTensorSpec, ShardOrderEntry, TensorMeta
from torch.distributed.tensor._op_schema import (
    OpSchema,
    OpSpec,
    OpStrategy,
    RuntimeSchemaInfo,
    TupleStrategy,
)
from torch.distributed.tensor._ops.single_dim_strategy import (
    _ShardingPlaceholder as ShardingPlaceholder,
    _SingleDimStrategyInfo as SingleDimStrategyInfo,
)
from torch.distributed.tensor.placement_types import _StridedShard as StridedShard

__all__ = [
    "DecompShardingStrategy",
    "DTensorSpec",
    "OpSchema",
    "OpSpec",
    "OpStrategy",
    "RuntimeSchemaInfo",
    "ShardOrderEntry",
    "ShardingPlaceholder",
    "SingleDimStrategyInfo",
    "StridedShard",
    "TensorMeta",
    "TupleStrategy",
]

"""Op-family rule modules. Importing this package registers every shipped rule."""

from dtensor_rules.ops import (  # noqa: F401
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
)

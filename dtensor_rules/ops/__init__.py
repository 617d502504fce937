"""Op-family rule modules. Importing this package registers every shipped rule."""

from dtensor_rules.ops import fma, gather_scatter, grouped_mm, indexing, moe_index, slicing, softmax  # noqa: F401

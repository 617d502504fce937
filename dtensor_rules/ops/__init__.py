"""Op-family rule modules. Importing this package registers every shipped rule."""

from dtensor_rules.ops import fma, grouped_mm, indexing, softmax  # noqa: F401

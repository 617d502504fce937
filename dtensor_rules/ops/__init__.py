"""Op-family rule modules. Importing this package registers every shipped rule."""

from dtensor_rules.ops import fma, moe_index, softmax  # noqa: F401

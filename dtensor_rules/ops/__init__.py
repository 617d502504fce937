"""Op-family rule modules. Importing this package registers every shipped rule."""

from dtensor_rules.ops import counting, fma, scan, softmax, sorting  # noqa: F401

"""Deprecated: moved to :mod:`dtensor_rules.cli.demo` (kept for one release)."""

import warnings

from dtensor_rules.cli.demo import *  # noqa: F401,F403
from dtensor_rules.cli.demo import __all__ as __all__  # noqa: F401

warnings.warn("dtensor_rules.demo moved to dtensor_rules.cli.demo", DeprecationWarning, stacklevel=2)

"""Deprecated: moved to :mod:`dtensor_rules.cli.coverage` (kept for one release)."""

import warnings

from dtensor_rules.cli.coverage import *  # noqa: F401,F403
from dtensor_rules.cli.coverage import __all__ as __all__  # noqa: F401

warnings.warn("dtensor_rules.coverage moved to dtensor_rules.cli.coverage", DeprecationWarning, stacklevel=2)

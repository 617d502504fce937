"""Deprecated: moved to :mod:`dtensor_rules.cli.coverage` (this alias stays for one release)."""

import warnings
from typing import Any

from dtensor_rules.cli import coverage as _moved

warnings.warn("dtensor_rules.coverage moved to dtensor_rules.cli.coverage", DeprecationWarning, stacklevel=2)


def __getattr__(name: str) -> Any:
    return getattr(_moved, name)

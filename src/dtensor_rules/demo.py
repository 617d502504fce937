"""Deprecated: moved to :mod:`dtensor_rules.cli.demo` (this alias stays for one release)."""

import warnings
from typing import Any

from dtensor_rules.cli import demo as _moved

warnings.warn("dtensor_rules.demo moved to dtensor_rules.cli.demo", DeprecationWarning, stacklevel=2)


def __getattr__(name: str) -> Any:
    return getattr(_moved, name)

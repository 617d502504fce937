"""The running torch version, and the releases this package is tested against."""

from __future__ import annotations

import torch

# (major, minor) releases the whole test suite passes on; setup.py states the same range.
TESTED_TORCH: tuple[tuple[int, int], ...] = ((2, 13), (2, 14))


def torch_version() -> tuple[int, int]:
    """``(major, minor)`` of the installed torch (``2.14.1+cu130`` -> ``(2, 14)``)."""
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


TORCH_VERSION = torch_version()

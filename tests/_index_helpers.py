"""Shared by the indexing tests."""

from __future__ import annotations

import torch


def idx(*vals: int) -> torch.Tensor:
    return torch.tensor(vals)

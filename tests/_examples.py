"""Property tests take their example counts from the hypothesis profile (tests/conftest.py).

A test whose examples cost far more or far less than the usual one scales the profile's count with
``scaled(factor)``, and says why next to it; ``HYPOTHESIS_PROFILE=thorough`` then raises it too.
"""

from __future__ import annotations

from typing import Any

from hypothesis import settings


def scaled(factor: float, **kwargs: Any) -> settings:
    """Settings with the loaded profile's ``max_examples`` times ``factor`` (at least 1)."""
    return settings(max_examples=max(1, round(settings.default.max_examples * factor)), **kwargs)

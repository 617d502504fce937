"""Shared test setup: hypothesis profiles (HYPOTHESIS_PROFILE=ci|dev|thorough)."""

import os

from hypothesis import HealthCheck, settings

_common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("ci", max_examples=12, derandomize=True, **_common)
settings.register_profile("dev", max_examples=12, **_common)
settings.register_profile("thorough", max_examples=200, **_common)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

"""Shared test setup: the hypothesis profiles (every property test's example count).

HYPOTHESIS_PROFILE=dev (the default): 10 examples, random, so runs explore new inputs;
ci (what .ci/run uses): 10 examples, derandomized, so a CI failure reproduces from the log;
thorough: 100 examples, random, before a release or after changing a rule (about 10x the suite's
property-test time). A test scales its count only with tests/_examples.py's ``scaled`` and a reason
(the validators' examples cost ~0.1-10 s, so 10 is what fits the suite's 10-minute budget).
Health checks: only ``too_slow`` and ``data_too_large`` are off (tensors are slow and big to draw).
"""

import os

from hypothesis import HealthCheck, settings

_common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("dev", max_examples=10, **_common)
settings.register_profile("ci", max_examples=10, derandomize=True, print_blob=True, **_common)
settings.register_profile("thorough", max_examples=100, **_common)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


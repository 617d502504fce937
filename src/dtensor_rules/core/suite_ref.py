"""A rule's sample suite named, not imported: the product never loads its test kit.

A shipped rule states its samples as ``register(op, samples=suite("scan", "cumsum_samples"))``.
The value is callable like the suite itself (``rule.samples()`` returns the ``(args, kwargs)``
list) but imports :mod:`dtensor_rules.testing.suites.<family>` only on that first call, which
only the checking tools make (``validate``, ``check_samples``, the coverage benchmark, tests).
So ``import dtensor_rules`` loads no ``dtensor_rules.testing`` module
(``tests/test_lazy_imports.py``), and the suites stay with the test kit that owns them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

SUITES_PACKAGE = "dtensor_rules.testing.suites"
Samples = Sequence[tuple[tuple[Any, ...], dict[str, Any]]]


@dataclass(frozen=True)
class SuiteRef:
    """``module.name``, a zero-argument function returning samples; resolved at each call
    (``importlib`` caches the module, so only the first call imports)."""

    module: str
    name: str

    @property
    def __name__(self) -> str:  # reads like the function it names (``rule.samples.__name__``)
        return self.name

    def resolve(self) -> Callable[[], Samples]:
        """The suite function itself; ImportError/AttributeError name a reference that points nowhere."""
        fn = getattr(importlib.import_module(self.module), self.name, None)
        if not callable(fn):
            raise AttributeError(f"sample suite {self.module}.{self.name} does not exist or is not callable")
        return fn

    def __call__(self) -> Samples:
        return self.resolve()()

    def __repr__(self) -> str:
        return f"<sample suite {self.module}.{self.name} (loaded on first call)>"


def suite(family: str, name: str) -> SuiteRef:
    """The suite ``name`` of ``dtensor_rules/testing/suites/<family>.py``, loaded on first call."""
    return SuiteRef(f"{SUITES_PACKAGE}.{family}", name)

"""A module fixture's expensive value computed once per test session, also across pytest-xdist workers.

With ``--dist worksteal`` the tests that read one module fixture may run on both workers, and each
would build it (a trainer launch: a minute of both cores). Under xdist the value is computed in the
folder the session's workers share, under a file lock; the other workers wait and read it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock


def once_per_session(tmp_path_factory: pytest.TempPathFactory, name: str,
                     compute: Callable[[Path], Any]) -> tuple[Any, Path]:
    """``(compute(folder), folder)``, ``compute`` run once per session; the value must be JSON (every
    caller gets it back from JSON, so the worker that computed it sees what the others see)."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        folder = tmp_path_factory.mktemp(name)
        return json.loads(json.dumps(compute(folder))), folder
    folder = tmp_path_factory.getbasetemp().parent / name  # this session's: the workers' common parent
    with FileLock(f"{folder}.lock"):
        value = folder / "value.json"
        if not value.is_file():
            folder.mkdir(exist_ok=True)
            value.write_text(json.dumps(compute(folder)))
        return json.loads(value.read_text()), folder

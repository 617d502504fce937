"""The post-import hook (``src/dtensor_rules/_upstream/post_import.py``) on a throwaway module: the callback runs
once, right after the module body, with the module; cancel() forgets it; the real loader stays visible."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import pytest

from dtensor_rules._upstream import post_import as _post_import
from dtensor_rules._upstream.post_import import when_imported


@pytest.fixture
def module_dir(tmp_path: Path, request: pytest.FixtureRequest):
    name = f"probe_{request.node.name.replace('[', '_').replace(']', '_')}"
    (tmp_path / f"{name}.py").write_text("VALUE = 41\n\ndef f():\n    return VALUE\n")
    sys.path.insert(0, str(tmp_path))
    yield name
    sys.path.remove(str(tmp_path))
    sys.modules.pop(name, None)


def test_callback_runs_once_after_the_module_body(module_dir: str) -> None:
    seen = []
    when_imported(module_dir, lambda m: seen.append((m.__name__, m.VALUE)))
    assert seen == [] and module_dir not in sys.modules
    module = __import__(module_dir)
    assert seen == [(module_dir, 41)]
    del sys.modules[module_dir]
    __import__(module_dir)  # a second import runs the body again, not the callback
    assert seen == [(module_dir, 41)]
    assert module_dir not in _post_import._pending  # (the finder leaves sys.meta_path once nothing is pending)
    assert "return VALUE" in inspect.getsource(module.f)  # introspection sees the real loader
    assert type(module.__loader__).__name__ == "SourceFileLoader"


def test_an_imported_module_gets_the_callback_at_once(module_dir: str) -> None:
    module = __import__(module_dir)
    seen = []
    when_imported(module_dir, seen.append)
    assert seen == [module]


def test_cancel_forgets_a_pending_callback(module_dir: str) -> None:
    seen = []
    cancel = when_imported(module_dir, seen.append)
    keep = when_imported(module_dir, lambda m: seen.append("kept"))
    cancel()
    __import__(module_dir)
    assert seen == ["kept"]
    keep()  # after the fact: nothing to do
    assert module_dir not in _post_import._pending


def test_the_finder_leaves_meta_path_when_nothing_is_pending(module_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_post_import, "_pending", {})  # as if no other module were watched
    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if f is not _post_import._FINDER])
    when_imported(module_dir, lambda m: None)
    assert sys.meta_path[0] is _post_import._FINDER
    __import__(module_dir)
    assert _post_import._FINDER not in sys.meta_path


def test_a_callback_error_reaches_the_importer(module_dir: str) -> None:
    def boom(module: object) -> None:
        raise RuntimeError("patch failed")

    when_imported(module_dir, boom)
    with pytest.raises(RuntimeError, match="patch failed"):  # never a silently missing patch
        __import__(module_dir)

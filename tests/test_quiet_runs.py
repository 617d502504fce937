"""What a single-process script sees besides its own output: no ``[rank0]:`` prefixes piling up per
simulated mesh, no upstream note from the package's own redistributes, no stray names at the top level."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
import torch
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

import dtensor_rules
from dtensor_rules.testing import simulated_mesh
from tests._fresh import ROOT

REDISTRIBUTE_LOGGER = "torch.distributed.tensor._redistribute"  # where upstream logs its note


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_simulated_meshes_leave_the_excepthook_as_they_found_it():
    before = sys.excepthook
    for shape in ((2,), (2, 2), (2,)):
        with simulated_mesh(shape):
            assert sys.excepthook is before
    assert sys.excepthook is before


@pytest.mark.slow  # a fresh interpreter: what it prints for an uncaught error is under test
def test_a_traceback_after_three_meshes_has_no_rank_prefix():
    code = ("import dtensor_rules\nfrom dtensor_rules.testing import simulated_mesh\n"
            "for shape in ((2,), (2, 2), (4,)):\n    with simulated_mesh(shape):\n        pass\n"
            "raise ValueError('the script failed')\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 1
    assert run.stderr.splitlines()[0] == "Traceback (most recent call last):", run.stderr
    assert run.stderr.rstrip().endswith("ValueError: the script failed") and "[rank" not in run.stderr


def test_a_log_line_after_three_meshes_has_no_rank_prefix(capfd):
    from torch._logging._internal import TorchLogsFormatter  # the format torch's own loggers print with

    for shape in ((2,), (2, 2), (4,)):
        with simulated_mesh(shape):
            pass
    record = logging.LogRecord(REDISTRIBUTE_LOGGER, logging.WARNING, __file__, 1, "a line", None, None)
    assert "[rank" not in TorchLogsFormatter().format(record)


def test_a_bool_mask_index_on_a_2d_mesh_logs_no_upstream_note():
    """``x[mask]`` with a mask sharded on both mesh dims: the package replicates the mask (its own call).
    ``x`` is laid out so that the index rule needs no move of it (its rows are whole on every rank)."""
    x, mask = torch.arange(16.0).reshape(8, 2), torch.tensor([1, 0, 0, 1, 1, 1, 0, 1], dtype=torch.bool)
    records = Records()
    logger = logging.getLogger(REDISTRIBUTE_LOGGER)
    level = logger.level
    logger.setLevel(logging.WARNING)  # as in a fresh script (another test may have quieted it)
    logger.addHandler(records)
    try:
        with simulated_mesh((2, 2), names=("quiet_a", "quiet_b")) as mesh:  # names of its own: upstream warns once per mesh
            xd = distribute_tensor(x, mesh, (Shard(1), Replicate()))
            md = distribute_tensor(mask, mesh, (Shard(0), Shard(0)))
            out = xd[md]
            assert not [m for m in records.messages if "sequential" in m], records.messages
            md.redistribute(mesh, (Replicate(),) * 2)  # control: the same move in one upstream call warns
            torch.testing.assert_close(out.full_tensor(), x[mask])
    finally:
        logger.removeHandler(records)
        logger.setLevel(level)
    assert [m for m in records.messages if "2 sequential all_gather" in m]


def _documented_names() -> set[str]:
    text = "\n".join(p.read_text() for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
    return {n for n in dtensor_rules.__all__ if f"dtensor_rules.{n}" in text or f"`{n}" in text}


def test_the_top_level_names_are_the_documented_api():
    import types

    public = {n for n in dir(dtensor_rules) if not n.startswith("_")}
    modules = {n for n in public if isinstance(getattr(dtensor_rules, n), types.ModuleType)}
    assert all(getattr(dtensor_rules, n).__name__ == f"dtensor_rules.{n}" for n in modules)  # subpackages only
    assert public - modules == set(dtensor_rules.__all__), sorted(public - modules - set(dtensor_rules.__all__))
    assert not {"os", "sys", "Any", "annotations"} & public
    assert _documented_names() == set(dtensor_rules.__all__), set(dtensor_rules.__all__) - _documented_names()

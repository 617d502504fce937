"""torchtitan 0.3.0's own trainer with our EP (one setting) vs its own EP, on 4 gloo ranks.

``--override.imports dtensor_rules.integrations.torchtitan.expert_parallel`` swaps the token moves of
torchtitan's EP for ours (dtensor_rules.integrations.torchtitan). The oracle is torchtitan's own EP
in the same launch, same config (``deepseek_v3_debugmodel`` cut to 3 layers, CPU shims in
tests/_titan_trainer.py): losses and grad norms must be EQUAL, bit for bit, at every step, since the
rows meet the same experts in the same order and torchtitan's combine sums them as under its EP.

Two launches (one torchrun each; torchtitan takes at most two trainers per process, see
tests/_titan_checks.py):

- ``ep2tp2``: tensor parallel 2 with the shared expert laid out by torchtitan x EP 2, FSDP on the
  other parameters, meta-device build and torchtitan's init: 3 steps from scratch each;
- ``ep4_resume``: torchtitan's EP trains 4 steps saving DCP checkpoints; ours loads its step 2 and
  trains steps 3 and 4, which equal torchtitan's.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests._torchtitan import require_torchtitan

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(tmp_path: Path, layout: str) -> dict[str, list[list[float]]]:
    require_torchtitan("torchtitan.train")
    out = tmp_path / f"{layout}.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4", "--master-addr", "127.0.0.1",
           "--master-port", str(_free_port()),
           "-m", "tests._titan_checks", str(out), layout]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_ours_equals_torchtitans_ep_at_tp2_x_ep2(tmp_path: Path) -> None:
    runs = _launch(tmp_path, "ep2tp2")
    assert [s for s, _, _ in runs["titan"]] == [1, 2, 3]
    assert runs["ours"] == runs["titan"]  # (step, loss, grad norm), bit for bit


def test_ours_resumes_from_torchtitans_checkpoint_and_equals_its_ep_at_ep4(tmp_path: Path) -> None:
    runs = _launch(tmp_path, "ep4_resume")
    assert [s for s, _, _ in runs["titan"]] == [1, 2, 3, 4]
    assert [s for s, _, _ in runs["ours_resumed"]] == [3, 4]
    assert runs["ours_resumed"] == runs["titan"][2:]
    assert runs["titan"][2] != runs["titan"][1]  # steps differ: a resume at the wrong step could not pass

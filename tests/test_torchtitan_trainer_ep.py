"""torchtitan 0.3.0's own trainer with our EP (one setting) vs its own EP, on 4 gloo ranks.

``--override.imports dtensor_rules.integrations.torchtitan.expert_parallel`` swaps the token moves of
torchtitan's EP for ours (dtensor_rules.integrations.torchtitan). The oracle is torchtitan's own EP
in the same launch, same config (``deepseek_v3_debugmodel`` cut to 3 layers, CPU shims in
tests/_titan_trainer.py): losses and grad norms must be EQUAL, bit for bit, at every step, since the
rows meet the same experts in the same order and torchtitan's combine sums them as under its EP.

Four launches (one torchrun each; torchtitan takes at most two trainers per process, see
tests/_titan_checks.py):

- ``ep2tp2``: tensor parallel 2 with the shared expert laid out by torchtitan x EP 2, FSDP on the
  other parameters, meta-device build and torchtitan's init: 3 steps from scratch each;
- ``ep4_resume``: torchtitan's EP trains 6 steps saving DCP checkpoints; ours loads its step 2 and
  trains steps 3 to 6, which equal torchtitan's, saving its own checkpoints;
- ``ep2_from_ep4``: those step-4 checkpoints resumed at EP 2 x expert FSDP 2, crossed (torchtitan's EP
  from ours', ours from torchtitan's): steps 5 and 6 equal bit for bit;
- ``ep4_compile``: torchtitan's ``--compile`` (backend ``aot_eager``), its EP and ours, 3 steps each;
- ``ep4_spmd_types`` (torch >= 2.14): ours under torchtitan's ``spmd_types`` backend, 3 steps, against
  torchtitan's EP under ``full_dtensor`` (``ep4_resume``'s first steps).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from tests._session_once import once_per_session
from tests._torchtitan import require_torchtitan

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(tmp_path: Path, layout: str, *extra: str) -> dict[str, list[list[float]]]:
    require_torchtitan("torchtitan.train")
    out = tmp_path / f"{layout}.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4", "--master-addr", "127.0.0.1",
           "--master-port", str(_free_port()),
           "-m", "tests._titan_checks", str(out), layout, *extra]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_ours_equals_torchtitans_ep_at_tp2_x_ep2(tmp_path: Path) -> None:
    runs = _launch(tmp_path, "ep2tp2")
    assert [s for s, _, _ in runs["titan"]] == [1, 2, 3]
    assert runs["ours"] == runs["titan"]  # (step, loss, grad norm), bit for bit


@pytest.fixture(scope="module")
def ep4_resume(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, list[list[float]]], Path]:
    """The ``ep4_resume`` launch's rows and its dump folder (both runs' DCP checkpoints), launched once
    per session: several tests read it."""
    rows, folder = once_per_session(tmp_path_factory, "titan_ep4_resume", lambda tmp: _launch(tmp, "ep4_resume"))
    return rows, folder / "ep4_resume.json.dump"


def test_ours_resumes_from_torchtitans_checkpoint_and_equals_its_ep_at_ep4(ep4_resume) -> None:
    runs, _ = ep4_resume
    assert [s for s, _, _ in runs["titan"]] == [1, 2, 3, 4, 5, 6]
    assert [s for s, _, _ in runs["ours_resumed"]] == [3, 4, 5, 6]
    assert runs["ours_resumed"] == runs["titan"][2:]
    assert runs["titan"][2] != runs["titan"][1]  # steps differ: a resume at the wrong step could not pass


def _flat(state: object, prefix: str = "") -> Iterator[tuple[str, object]]:
    if isinstance(state, dict):
        for k, v in state.items():
            yield from _flat(v, f"{prefix}/{k}")
    elif isinstance(state, (list, tuple)):
        for i, v in enumerate(state):
            yield from _flat(v, f"{prefix}[{i}]")
    else:
        yield prefix, state


def _checkpoint(folder: Path, out: Path) -> dict[str, object]:
    """Every entry of a DCP checkpoint (model, optimizer, schedule, data position, step), unsharded."""
    dcp_to_torch_save(folder, out)
    return dict(_flat(torch.load(out, weights_only=False)))


def _same(a: object, b: object) -> bool:
    return torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


def test_checkpoints_resume_across_a_change_of_ep_degree_both_ways(ep4_resume, tmp_path: Path) -> None:
    """ep4 -> ep2 x efsdp 2: torchtitan's EP resumes from the checkpoint ours saved, ours from the one
    torchtitan's saved; the two checkpoints are equal entry for entry, so the two resumed runs start
    from the same state and must train steps 5 and 6 bit for bit alike."""
    runs4, dump = ep4_resume
    titan_ckpt = _checkpoint(dump / "titan" / "checkpoint" / "step-4", tmp_path / "titan.pt")
    ours_ckpt = _checkpoint(dump / "ours" / "checkpoint" / "step-4", tmp_path / "ours.pt")
    assert titan_ckpt.keys() == ours_ckpt.keys()
    assert any(k.startswith("/optimizer") for k in titan_ckpt) and titan_ckpt["/train_state/step"] == 4
    assert [k for k in titan_ckpt if not _same(titan_ckpt[k], ours_ckpt[k])] == []

    runs2 = _launch(tmp_path, "ep2_from_ep4", str(dump))
    assert [s for s, _, _ in runs2["titan_from_ours"]] == [5, 6]
    assert runs2["ours_from_titan"] == runs2["titan_from_ours"]  # (step, loss, grad norm), bit for bit
    # torchtitan's own EP at ep2 after the resume vs its uninterrupted ep4 run: another reduction
    # order for the expert gradients (efsdp), so equal within the spread of its own EP degrees (and
    # far from the neighbouring steps' values: a resume at the wrong step could not pass)
    for (_, loss2, norm2), (_, loss4, norm4) in zip(runs2["titan_from_ours"], runs4["titan"][4:], strict=True):
        assert loss2 == pytest.approx(loss4, rel=1e-4) and norm2 == pytest.approx(norm4, rel=1e-4)


def test_ours_compiled_equals_torchtitans_ep_compiled_and_eager_at_ep4(ep4_resume, tmp_path: Path) -> None:
    """torchtitan's ``--compile`` (each transformer block one fullgraph compile, backend aot_eager) at ep4:
    our moves are two opaque custom ops in its graphs, and the losses and grad norms equal its EP's,
    compiled and eager (aot_eager runs eager's kernels in eager's order)."""
    runs = _launch(tmp_path, "ep4_compile")
    assert [s for s, _, _ in runs["titan"]] == [1, 2, 3]
    assert runs["ours"] == runs["titan"]  # (step, loss, grad norm), bit for bit
    assert runs["titan"] == ep4_resume[0]["titan"][:3]


# torch 2.13's fully_shard refuses the plain, SPMD-annotated parameters of the spmd_types backend
# ("all parameters must be DTensors"), for torchtitan's own EP as for ours; 2.14 translates them
_SPMD_FSDP = tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 14)


@pytest.mark.skipif(not _SPMD_FSDP, reason="torchtitan's spmd_types backend needs torch >= 2.14 (fully_shard of "
                                            "SPMD-annotated parameters); torchtitan's own EP fails there the same way")
def test_ours_under_the_spmd_types_backend_equals_torchtitans_ep_at_ep4(ep4_resume, tmp_path: Path) -> None:
    """torchtitan's default backend, ``spmd_types`` (plain tensors with SPMD types, no DTensors): ours trains
    there and equals torchtitan's EP under ``full_dtensor`` bit for bit (torchtitan's own EP cannot be the
    oracle under ``spmd_types`` on gloo: its token all_to_all is the list form, which gloo refuses for
    chunks of different sizes)."""
    runs = _launch(tmp_path, "ep4_spmd_types")
    assert [s for s, _, _ in runs["ours"]] == [1, 2, 3]
    assert runs["ours"] == ep4_resume[0]["titan"][:3]  # (step, loss, grad norm), bit for bit

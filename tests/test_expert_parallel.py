"""Expert parallelism (``dtensor_rules.ep.expert_parallel``) on real gloo ranks.

Each gloo launch runs several cases (spawning ranks is the slow part); module-scoped
fixtures launch once and the tests read the per-rank results:

- EP x TP on a 2x2 mesh and EP alone on a 4-rank mesh: output, loss and every gradient
  equal one device (fp32: 1e-5 abs + rel; bf16: 4 bf16 ulps of the largest |value|),
  with uneven routing (an expert with no tokens; every token to one expert, so one ep
  rank receives nothing);
- expert weights' gradients keep the parameters' placements, and each rank holds
  1/(ep*tp) of the expert parameter and gradient bytes;
- ``CommDebugMode``: no all_gather in forward or backward, exactly the expected
  all-to-alls (the ``shard_moe`` gather path on the same mesh does all_gather: the
  assertion can fail);
- EP x TP x FSDP2 (``fully_shard`` on dp) on 8 ranks (2x2x2).
"""

from __future__ import annotations

import pytest
import torch

from dtensor_rules.testing import run_gloo
from tests._ep_workers import CASES, RankResult, WorkerResult, ep_worker, fsdp_worker

pytestmark = pytest.mark.slow

RUNS_2D = [(case, torch.float32) for case in CASES] + [("random", torch.bfloat16), ("all_to_one", torch.bfloat16)]
RUNS_1D = [("random", torch.float32), ("all_to_one", torch.float32)]


@pytest.fixture(scope="module")
def ep_tp() -> list[WorkerResult]:
    return run_gloo(ep_worker, 4, (2, 2), RUNS_2D)


@pytest.fixture(scope="module")
def ep_only() -> list[WorkerResult]:
    return run_gloo(ep_worker, 4, (4,), RUNS_1D)


def _assert_matches(r: RankResult, label: str) -> None:
    bad = {k: (d, r.bounds[k]) for k, d in r.diffs.items() if not d <= r.bounds[k]}
    assert not bad, f"{label}: |ep - single device| above the bound (diff, bound): {bad}"
    assert set(r.diffs) >= {"output", "grad x", "grad gate", "grad w1", "grad w3", "grad w2", "grad shared_w1"}


@pytest.mark.parametrize("i", range(len(RUNS_2D)))
def test_ep_x_tp_equals_single_device(ep_tp: list[WorkerResult], i: int) -> None:
    for rank, res in enumerate(ep_tp):
        _assert_matches(res.runs[i], f"2x2 {RUNS_2D[i]} rank {rank}")


@pytest.mark.parametrize("i", range(len(RUNS_1D)))
def test_ep_alone_equals_single_device(ep_only: list[WorkerResult], i: int) -> None:
    for rank, res in enumerate(ep_only):
        _assert_matches(res.runs[i], f"ep=4 {RUNS_1D[i]} rank {rank}")


def test_expert_grads_stay_sharded_and_bytes_divide(ep_tp: list[WorkerResult], ep_only: list[WorkerResult]) -> None:
    for results, divisor, want in ((ep_tp, 4, "(Shard(dim=0), Shard(dim="), (ep_only, 4, "(Shard(dim=0),)")):
        for res in results:
            r = res.runs[0]
            for w in ("w1", "w3", "w2"):
                assert r.grad_placements[w].startswith(want), (w, r.grad_placements[w])
            params, grads = r.expert_bytes
            assert params == grads == r.expert_total_bytes // divisor


def test_no_all_gather_only_the_expected_all_to_alls(ep_tp: list[WorkerResult], ep_only: list[WorkerResult]) -> None:
    for res in [*ep_tp, *ep_only]:
        for r in res.runs:
            for phase in ("forward", "backward"):
                assert "all_gather" not in r.comm.get(phase, {}), (phase, r.comm)
            # forward: counts, tokens out, results back; backward: the two token all-to-alls transposed
            assert r.comm["forward"]["all_to_all"] == 3 and r.comm["backward"]["all_to_all"] == 2, r.comm
    # the contrast: the shard_moe gather path gathers experts and tokens on the same mesh
    gather = ep_tp[0].gather_calls
    assert gather["forward"].get("all_gather", 0) + gather["backward"].get("all_gather", 0) > 0, gather


def test_a_rank_that_receives_nothing_still_matches(ep_only: list[WorkerResult]) -> None:
    """all_to_one on ep=4: only expert 0 (rank 0) gets tokens; ranks 1..3 receive no rows.

    Their outputs and gradients already matched one device above; here: their local
    expert gradients are exact zeros (no garbage from the uncomputed padding rows)
    while rank 0's are not, and the random routing gives every rank a nonzero gradient.
    """
    i = [c for c, _ in RUNS_1D].index("all_to_one")
    local = [res.runs[i].local_expert_grad_abs for res in ep_only]
    assert local[0] > 0 and local[1:] == [0.0, 0.0, 0.0], local
    assert all(res.runs[0].local_expert_grad_abs > 0 for res in ep_only)


def test_ep_x_tp_x_fsdp2_on_8_ranks() -> None:
    results = run_gloo(fsdp_worker, 8, "random")
    for rank, r in enumerate(results):
        _assert_matches(r, f"fsdp 2x2x2 rank {rank}")
        for w in ("w1", "w3", "w2"):
            placements = r.grad_placements[w]
            assert "Shard(dim=0)" in placements and "Replicate" not in placements, (w, placements)
        params, grads = r.expert_bytes
        assert params == grads == r.expert_total_bytes // 8

"""The ragged moves on a real 4-rank gloo group: real split-size all-to-alls and all-gathers."""

from __future__ import annotations

import pytest

from dtensor_rules.testing import run_gloo

from tests._ragged_oracle import CASES, rows_of
from tests._ragged_workers import ragged_worker


@pytest.mark.slow
def test_four_gloo_ranks_dispatch_combine_gather_and_backward() -> None:
    results = run_gloo(ragged_worker, 4)
    C = CASES[4]
    for rank, got in enumerate(results):
        want_rows = [len(rows_of(C, rank, False)), len(rows_of(C, rank, True))]
        assert got == {"unaligned": True, "aligned": True, "combined": True, "full": True, "grad": True,
                       "local_rows": want_rows}, (rank, got)


@pytest.mark.slow
def test_dcp_saves_the_aligned_box_and_refuses_unaligned(tmp_path) -> None:
    from tests._ragged_workers import ragged_checkpoint_worker

    results = run_gloo(ragged_checkpoint_worker, 4, str(tmp_path / "ckpt"))
    assert results == [{"loaded": True, "unaligned_refused": "DCP"}] * 4, results

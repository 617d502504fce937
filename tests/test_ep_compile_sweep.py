"""``expert_parallel`` compiled (``dynamic=True``, with autograd) at 0, 1, 2, ... token rows per rank.

ONE world of 2 gloo ranks (ep = 2, 4 experts) runs every case; each (backend, router) compiles the
block once and calls it with token counts whose shards are 1 + 1 rows (2 tokens: the crash this file
pins down), 0 + 0, 1 + 0, 2 + 1 and 3 + 2 (odd totals: uneven shards), with routings steered by
``expert_bias`` (every token to one expert, an expert nobody picks, an ep rank that receives no
row). ``aot_eager``: top-1 and top-k = E; ``inductor``: top-2 (the default router) at 2 and 3
tokens. Each call's output and the gradients of the tokens and of every parameter equal the block
on one device (plain torch; the expert matmuls in bf16 in both, see ``compiled_sweep_worker``).

What it pins down (``_upstream/static_shards.py``): with 2 tokens every rank holds one row, whose
size Dynamo makes static, and unguarded the backward fixes the global size to 2 only while
AOTAutograd traces it: ``TypeError: 'NoneType' object cannot be interpreted as an integer`` at the
first call. And a global size that is a constant (0 or 1 tokens in all) needs a guard: without it the
graph compiled for 0 tokens ran again for 1 token on the rank holding none (a hang: the ranks ran
different collectives). The same world checks that upstream still has the second defect (plain
``x * 2`` compiled, outside the EP block), which is why the EP region installs the guard itself.
The eager sweep over more routers and meshes is ``tests/test_ep_sweep.py``.
"""

from __future__ import annotations

import pytest

from dtensor_rules.testing import run_gloo
from tests._ep_sweep import E, Call, compiled_sweep_worker, promised

pytestmark = pytest.mark.slow  # starts 2 rank processes and compiles

PLAN = [
    ("aot_eager", 1, [Call(2, "random"), Call(2, "all_to_one"), Call(0, "random"), Call(1, "all_to_one"),
                      Call(3, "empty_rank"), Call(5, "empty_expert"), Call(5, "all_to_one")]),
    ("aot_eager", E, [Call(2, "random"), Call(1, "random"), Call(5, "random")]),
    ("inductor", 2, [Call(2, "random"), Call(3, "all_to_one")]),
]


def test_compiled_expert_parallel_equals_one_device_at_every_row_count() -> None:
    results = run_gloo(compiled_sweep_worker, 2, PLAN, timeout=900)
    for rank, r in enumerate(results):
        for backend, top_k, calls in PLAN:
            got = r[f"{backend} top-{top_k}"]
            assert not promised(tuple(calls), top_k, got["counts"]), promised(tuple(calls), top_k, got["counts"])
            assert not got["problems"], f"rank {rank}, {backend} top-{top_k}:\n" + "\n".join(got["problems"])
    # upstream: rank 1 holds no row of either input; the graph compiled for 0 rows in all is reused
    assert [r["upstream_stale_shape"] for r in results] == [False, True], (
        "upstream now guards a DTensor's constant global size: guard_global_sizes' spec guard may go")

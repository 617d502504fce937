"""``expert_parallel`` eager on simulated meshes: every router width, every token count, every routing skew.

For top-1 up to top-k = E (4 experts) and token counts that give a rank 0, 1, 2, ... rows (even and
odd totals, so uneven shards), with routings steered by ``expert_bias``: random; every token to the
last expert (top-1: the other ep ranks receive nothing); an expert nobody picks; both of ep rank 0's
experts unpicked (it receives no row). Each call's output and the gradients of the tokens and of
every parameter equal the same block on one device (plain torch), on every simulated rank, on ep=2,
ep=4 (ranks holding no token) and ep=2 x tp=2. The routing each call promises is checked on the
one-device block, so the sweep cannot silently lose a case. Both dispatch modes: ``per_expert`` and
``per_rank`` (a row per (token, destination rank); only the fp32 summation order differs, well
inside the bound, ``tests/test_ep_per_rank.py``). The compiled sweep on real ranks is
``tests/test_ep_compile_sweep.py``.
"""

from __future__ import annotations

import pytest

from dtensor_rules.testing import local_shards, simulated_mesh
from tests._ep_sweep import E, Call, deep_ep_copy, promised, reference, run_calls

EP2_CALLS = (Call(0, "random"), Call(1, "all_to_one"), Call(2, "empty_rank"), Call(3, "empty_expert"),
             Call(5, "random"), Call(8, "all_to_one"))
EP4_CALLS = (Call(1, "random"), Call(2, "all_to_one"), Call(3, "empty_expert"), Call(6, "empty_rank"))
EP_TP_CALLS = (Call(0, "random"), Call(1, "empty_expert"), Call(3, "all_to_one"), Call(6, "empty_rank"))
SWEEP = [((2,), k, EP2_CALLS) for k in range(1, E + 1)] + [((4,), k, EP4_CALLS) for k in (1, E)] \
    + [((2, 2), 2, EP_TP_CALLS)]


@pytest.mark.parametrize("dispatch", ["per_expert", "per_rank"])
@pytest.mark.parametrize(("mesh_shape", "top_k", "calls"), SWEEP,
                         ids=[f"{'x'.join(map(str, m))}-top{k}" for m, k, _ in SWEEP])
def test_eager_expert_parallel_equals_one_device(mesh_shape: tuple[int, ...], top_k: int,
                                                 calls: tuple[Call, ...], dispatch: str) -> None:
    tp = "tp" if len(mesh_shape) == 2 else None
    ref = reference(top_k)
    with simulated_mesh(mesh_shape, names=("ep", "tp")[: len(mesh_shape)]) as mesh:
        model = deep_ep_copy(ref, mesh, tp_dim=tp, dispatch=dispatch)
        found, counts = run_calls(model, model, ref, mesh, calls, local_shards, tp_dim=tp)
    assert not promised(calls, top_k, counts), promised(calls, top_k, counts)
    assert not found, "\n".join(found)

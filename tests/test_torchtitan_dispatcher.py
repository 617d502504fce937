"""``DtensorRulesTokenDispatcher`` (dtensor_rules.integrations.torchtitan) on 4 ranks vs torchtitan on one.

Each rank (a thread of upstream's threaded process group) routes its own tokens through torchtitan
0.3.0's ``GroupedExperts`` holding its 2 of the 8 experts, with our dispatcher in torchtitan's
``RoutedExperts`` seam (dispatch -> experts -> combine). The oracle is torchtitan's own EP=1 path on the
same tokens with all 8 experts (``LocalTokenDispatcher``, the full ``GroupedExperts``): the per-rank
output, token gradient, routing-score gradient and this rank's slice of the expert gradients.

- fp32 moves: output and token/score gradients equal bit for bit (the same rows meet the same experts,
  and torchtitan's combine sums them in its order); an expert's gradient is the sum of the 4 ranks'
  one-device gradients within 4 bf16 ulps (each one-device gradient is a bf16 product rounded once;
  the trainer test compares with torchtitan's EP itself bit for bit).
- ``bf16_dispatch``: output, score and expert gradients equal bit for bit to the fp32 moves (the casts
  only move across the wire); the token gradient differs: each of a token's K returned row gradients is
  rounded once to bf16 before they are summed (the numerics the docs state). Bytes (``CommBytesMode``): every row move at 2 bytes per
  element: <= 1.05x the bf16 bound (rows moved x dim x 2 per move, the count exchange on top).
- ``dispatch="per_rank"``: output, token and score gradients within K fp32 ulps of the largest value
  (a token's K weighted rows are summed per destination rank first); expert gradients as for fp32
  moves; the token rows each rank sends (``CommBytesMode.ep_sent``) are its (token, destination rank)
  pairs, counted from the routing, in the dispatch and in the combine's backward, and the combine
  returns as many rows over all ranks.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from tests._thread_ranks import run_on_thread_ranks
from tests._torchtitan import require_torchtitan

WORLD, E, K, T, D, H = 4, 8, 2, 48, 32, 64
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:In CPU autocast")]


def _experts(n: int, weights: dict[str, torch.Tensor] | None = None):
    from torchtitan.models.common.moe import GroupedExperts

    m = GroupedExperts.Config(dim=D, hidden_dim=H, num_experts=n).build()
    with torch.no_grad():
        for name, p in m.named_parameters():
            p.copy_(weights[name])
    return m


def _run(experts, dispatcher, x, scores, ids, cot):
    x = x.clone().requires_grad_()
    scores = scores.clone().requires_grad_()
    counts = torch.zeros(E, dtype=torch.int64).scatter_add_(0, ids.reshape(-1), torch.ones(ids.numel(), dtype=torch.int64))
    routed, per_expert, meta = dispatcher.dispatch(x, scores, ids, counts)
    # forward, not __call__: CommBytesMode's module tracker hooks every module call globally, and the
    # ranks here are threads of one process (another rank's call would reach this rank's tracker)
    out = dispatcher.combine(experts.forward(routed, per_expert), meta, x)
    (out * cot).sum().backward()
    return {"out": out.detach(), "grad x": x.grad, "grad scores": scores.grad,
            **{f"grad {n}": p.grad for n, p in experts.named_parameters()}}


def _rank_case(full: dict[str, torch.Tensor], bf16: bool, dispatch: str = "per_expert") -> dict[str, object]:
    from torchtitan.models.common.token_dispatcher import LocalTokenDispatcher
    from torch.distributed.tensor.debug import CommDebugMode  # noqa: F401  (CommBytesMode counts the custom ops)

    from dtensor_rules.integrations.torchtitan import DtensorRulesTokenDispatcher
    from dtensor_rules.testing.comm import CommBytesMode

    rank = dist.get_rank()
    g = torch.Generator().manual_seed(100 + rank)
    x, cot = torch.randn(T, D, generator=g), torch.randn(T, D, generator=g)
    scores, ids = torch.rand(T, E, generator=g).softmax(-1).topk(K, dim=-1)
    want = _run(_experts(E, full), LocalTokenDispatcher.Config(num_experts=E, top_k=K).build(), x, scores, ids, cot)

    mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("ep",))
    n_local = E // WORLD
    local = {n: w[rank * n_local:(rank + 1) * n_local] for n, w in full.items()}
    ours = DtensorRulesTokenDispatcher.Config(num_experts=E, top_k=K, bf16_dispatch=bf16, dispatch=dispatch).build()
    ours.wire_meshes(ep_mesh=mesh)
    with CommBytesMode() as comm:
        got = _run(_experts(n_local, local), ours, x, scores, ids, cot)
    rows = {(p, op): v for p in comm.ep_sent for (op, shape), v in comm.ep_sent[p].items() if shape == (D,)}
    return {"want": want, "got": got, "bytes": comm.total_bytes("all_to_all"),
            "calls": sum(comm.calls[p]["all_to_all"] for p in comm.calls), "token bytes sent": rows,
            "distinct": int(torch.zeros(T, WORLD, dtype=torch.bool).scatter_(1, ids // (E // WORLD), True).sum())}


@pytest.fixture(scope="module")
def weights() -> dict[str, torch.Tensor]:
    require_torchtitan("torchtitan.models.common.token_dispatcher")
    g = torch.Generator().manual_seed(0)
    return {"w1_EFD": torch.randn(E, H, D, generator=g) * D**-0.5, "w2_EDF": torch.randn(E, D, H, generator=g) * H**-0.5,
            "w3_EFD": torch.randn(E, H, D, generator=g) * D**-0.5}


def test_fp32_moves_equal_torchtitan_on_one_device(weights) -> None:
    ranks = run_on_thread_ranks(lambda: _rank_case(weights, bf16=False), WORLD)
    n_local = E // WORLD
    for r, res in enumerate(ranks):
        for name, w in res["want"].items():
            got = res["got"][name]
            if not name.startswith("grad w"):
                assert torch.equal(got, w), f"rank {r} {name}: |diff| {float((got - w).abs().max())}"
                continue
            # an expert's gradient sums every rank's tokens: the sum of the ranks' one-device gradients
            # of this rank's experts; torchtitan rounds each bf16 product once, the sum of 4 rounds 4 times
            want = sum(q["want"][name] for q in ranks)[r * n_local:(r + 1) * n_local]
            bound = 4 * float(want.abs().max()) * 2.0**-8
            assert float((got - want).abs().max()) <= bound, f"rank {r} {name}"


def test_bf16_dispatch_is_exact_but_the_token_gradient_and_halves_the_bytes(weights) -> None:
    fp32 = run_on_thread_ranks(lambda: _rank_case(weights, bf16=False), WORLD)
    bf16 = run_on_thread_ranks(lambda: _rank_case(weights, bf16=True), WORLD)
    for r, (a, b) in enumerate(zip(fp32, bf16)):
        for name, w in a["got"].items():
            if name == "grad x":
                # each of a token's K returned row gradients rounds once to bf16 (half an ulp, 2**-9
                # relative) before the K are summed: |diff| <= K * 2**-9 * the largest row gradient,
                # bounded here by K * 2**-8 * max |grad x|
                bound = K * 2.0**-8 * float(w.abs().max())
                assert float((b["got"][name] - w).abs().max()) <= bound, f"rank {r}"
                assert not torch.equal(b["got"][name], w)  # the rounding is real: the flag changes this gradient
                continue
            assert torch.equal(b["got"][name], w), f"rank {r} {name}: |diff| {float((b['got'][name] - w).abs().max())}"
        # 4 row moves (dispatch, combine and their backwards), each counted as max(rows sent, rows received)
        # x dim x element size; the bf16 bound is those rows at 2 bytes: half the fp32 run's row bytes
        count_bytes = E * 8  # the one count exchange (E int64 out and in, forward only)
        fp32_rows = a["bytes"] - count_bytes
        assert a["calls"] == b["calls"] == 5
        assert b["bytes"] - count_bytes == fp32_rows // 2, (a["bytes"], b["bytes"])
        assert b["bytes"] <= 1.05 * (fp32_rows // 2), (b["bytes"], fp32_rows // 2)


def test_per_rank_dispatch_equals_torchtitan_up_to_the_summation_order(weights) -> None:
    """``dispatch="per_rank"``: a row per (token, destination rank) each way. Output, token and score
    gradients within fp32 reordering of a token's K weighted rows (K ulps of the largest value);
    expert gradients as in the fp32 test; token bytes sent: dim x 4 x the (token, rank) pairs, each way."""
    ranks = run_on_thread_ranks(lambda: _rank_case(weights, bf16=False, dispatch="per_rank"), WORLD)
    n_local = E // WORLD
    for r, res in enumerate(ranks):
        for name, w in res["want"].items():
            got = res["got"][name]
            if name.startswith("grad w"):
                w = sum(q["want"][name] for q in ranks)[r * n_local:(r + 1) * n_local]
                bound = 4 * float(w.abs().max()) * 2.0**-8
            else:
                bound = K * 2.0**-24 * (1 + float(w.abs().max()))
            assert float((got - w).abs().max()) <= bound, f"rank {r} {name}: |diff| {float((got - w).abs().max())}"
        # the dispatch (and the combine's transpose in the backward) sends each of this rank's
        # (token, destination rank) pairs once; the combine returns the rows this rank received
        pairs = res["distinct"]
        assert pairs < T * K, "the routing must put both of some token's experts on one rank"
        sent = res["token bytes sent"]
        assert sent[("forward", "ep_dispatch")] == sent[("backward", "ep_dispatch")] == pairs * D * 4, sent
    combined = {p: sum(res["token bytes sent"][(p, "ep_combine")] for res in ranks) for p in ("forward", "backward")}
    pairs = sum(res["distinct"] for res in ranks)
    assert combined == {"forward": pairs * D * 4, "backward": pairs * D * 4}, combined

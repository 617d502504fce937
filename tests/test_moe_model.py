"""The DeepSeekV3-style MoE block: grouped path vs a naive per-expert loop, tracing, sharded runs."""

from __future__ import annotations

import copy
import dataclasses
import sys

import pytest
import torch
import torch.nn.functional as F

import dtensor_rules  # noqa: F401  (installs the rules for the sharded tests)
from dtensor_rules.models.moe import MoE, MoEConfig, alignment_for, shard_moe

CONFIG = MoEConfig(dim=16, hidden=32, n_experts=4, top_k=2, n_shared=1)


def make(dtype: torch.dtype, config: MoEConfig = CONFIG, seed: int = 1) -> MoE:
    model = MoE(config, dtype=dtype)
    model.init_weights(seed)
    return model


def tokens(dtype: torch.dtype, shape: tuple[int, ...] = (4, 5, 16), seed: int = 3) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def loop_reference(model: MoE, x: torch.Tensor) -> torch.Tensor:
    """Token by token, expert by expert: no padding, no permutation, no grouped_mm."""
    c = model.config
    x2 = x.reshape(-1, c.dim)
    idx, weights = model.route(x2)
    rows = []
    for t in range(x2.shape[0]):
        acc = torch.zeros(c.dim, dtype=torch.float64)
        for j in range(c.top_k):
            e = int(idx[t, j])
            h = F.silu(x2[t] @ model.w1[e]) * (x2[t] @ model.w3[e])
            acc = acc + (h @ model.w2[e]).double() * weights[t, j].double()
        rows.append(acc)
    routed = torch.stack(rows).to(x.dtype)
    return (routed + model.shared(x2)).reshape(x.shape)


def value_and_grads(model: torch.nn.Module, x: torch.Tensor, fn=None) -> list[torch.Tensor]:
    x = x.detach().clone().requires_grad_()
    out = model(x) if fn is None else fn(model, x)
    cot = tokens(torch.float32, tuple(out.shape), seed=7).to(out.dtype)
    grads = torch.autograd.grad(out, [x, *model.parameters()], cot)
    return [out.detach(), *grads]


def test_grouped_path_matches_loop_reference_float32() -> None:
    model = make(torch.float32)
    x = tokens(torch.float32)
    got = value_and_grads(model, x)
    want = value_and_grads(model, x, loop_reference)
    assert len(got) == 2 + len(list(model.parameters()))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def test_grouped_path_matches_loop_reference_bfloat16() -> None:
    model = make(torch.bfloat16)
    x = tokens(torch.bfloat16)
    got = value_and_grads(model, x)
    want = value_and_grads(model, x, loop_reference)
    for g, w in zip(got, want):
        # bf16: 8 bits of mantissa; sums of ~hidden products, so a few ulps of the largest value
        torch.testing.assert_close(g.float(), w.float(), atol=0.02 * w.abs().max().item(), rtol=2e-2)


def test_every_expert_receives_tokens_and_the_bias_changes_selection() -> None:
    """Guard against a degenerate sample: the comparison above must exercise all experts."""
    model = make(torch.float32)
    idx, _ = model.route(tokens(torch.float32).reshape(-1, 16))
    assert set(idx.flatten().tolist()) == set(range(CONFIG.n_experts))
    biased = copy.deepcopy(model)
    biased.expert_bias.copy_(torch.tensor([10.0, 10.0, -10.0, -10.0]))
    idx_b, w_b = biased.route(tokens(torch.float32).reshape(-1, 16))
    assert set(idx_b.flatten().tolist()) == {0, 1}
    torch.testing.assert_close(w_b.sum(-1), torch.ones(w_b.shape[0]))  # normalized weights


def test_padded_layout_is_aligned_and_complete() -> None:
    model = make(torch.bfloat16)
    x2 = tokens(torch.bfloat16).reshape(-1, 16)
    idx, _ = model.route(x2)
    order, dest, offs = model.dispatch(idx, torch.bfloat16)
    A, L = alignment_for(torch.bfloat16), model.buffer_len(x2.shape[0], torch.bfloat16)
    assert A == 8 and offs.dtype == torch.int32 and int(offs[-1]) == L
    starts = torch.cat([offs.new_zeros(1), offs[:-1]]).long()
    assert all(int(s) % A == 0 for s in starts)
    assert len(set(dest.tolist())) == dest.numel()  # no two assignments share a row
    experts = model.flat_assignments(idx)[order]
    for row, e in zip(dest.tolist(), experts.tolist()):
        assert int(starts[e]) <= row < int(offs[e])  # each assignment lands in its expert's group


def test_init_is_deterministic_per_seed() -> None:
    a, b, c = make(torch.float32, seed=5), make(torch.float32, seed=5), make(torch.float32, seed=6)
    for (na, pa), (_, pb), (_, pc) in zip(a.state_dict().items(), b.state_dict().items(), c.state_dict().items()):
        assert torch.equal(pa, pb), na
        assert not torch.equal(pa, pc), na


def test_traces_with_make_fx_without_data_dependent_ops() -> None:
    from dtensor_rules.cli.coverage import trace_joint

    graph = trace_joint(make(torch.bfloat16), (tokens(torch.bfloat16),))
    targets = {n.target for n in graph.graph.nodes if n.op == "call_function"}
    assert torch.ops.aten._grouped_mm.default in targets
    assert torch.ops.aten._local_scalar_dense.default not in targets  # no .item() on the hot path


def _kernel_twin(model: MoE) -> MoE:
    """Same weights and buffers, permute_impl='kernel' (the real dtensor_rules.kernels op)."""
    twin = MoE(dataclasses.replace(model.config, permute_impl="kernel"), dtype=model.gate.dtype)
    twin.load_state_dict(model.state_dict())
    return twin


ROUTINGS = {
    "all experts used": None,
    "experts 2 and 3 get no tokens": torch.tensor([10.0, 10.0, -10.0, -10.0]),
}


@pytest.mark.parametrize("routing", list(ROUTINGS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_kernel_permute_impl_is_identical_to_torch_impl(dtype: torch.dtype, routing: str) -> None:
    """Same ops on the same rows in the same order: outputs and every gradient bit-identical."""
    torch_model = make(dtype)
    if ROUTINGS[routing] is not None:
        torch_model.expert_bias.copy_(ROUTINGS[routing])
    kernel_model = _kernel_twin(torch_model)
    x = tokens(dtype)
    got, want = value_and_grads(kernel_model, x), value_and_grads(torch_model, x)
    assert len(got) == len(want) == 2 + len(list(torch_model.parameters()))
    for name, g, w in zip(["output", "grad x", *dict(torch_model.named_parameters())], got, want):
        assert torch.equal(g, w), f"{name}: max diff {(g.float() - w.float()).abs().max()}"


def test_kernel_permute_impl_calls_the_custom_op_and_drops_padding_rows() -> None:
    """The kernel path really runs dtensor_rules.kernels.moe_permute_indices, and its output
    has -1 padding rows inside expert blocks and past m_offsets[-1] (so the combine's
    'keep only index >= 0' matters for this sample)."""
    from dtensor_rules.cli.coverage import trace_joint
    from dtensor_rules.kernels import moe_permute_indices

    model = _kernel_twin(make(torch.bfloat16))
    graph = trace_joint(model, (tokens(torch.bfloat16),))
    targets = {n.target for n in graph.graph.nodes if n.op == "call_function"}
    assert torch.ops.dtensor_rules.moe_permute_indices.default in targets

    x2 = tokens(torch.bfloat16).reshape(-1, CONFIG.dim)
    idx, _ = model.route(x2)
    counts = torch.bincount(idx.reshape(-1), minlength=CONFIG.n_experts)
    L, A = model.buffer_len(x2.shape[0], torch.bfloat16), alignment_for(torch.bfloat16)
    perm, sizes, offs = moe_permute_indices(counts, CONFIG.n_experts, 1, L, A)
    end = int(offs[-1])
    assert end < L and (perm[end:] == -1).all()  # tail past the last block: never computed
    assert (perm[:end] == -1).any()  # padding inside the blocks
    assert sorted(perm[perm >= 0].tolist()) == list(range(idx.numel()))  # every assignment exactly once


def test_kernel_permute_impl_without_kernels_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "dtensor_rules.kernels", None)  # import fails
    model = MoE(dataclasses.replace(CONFIG, permute_impl="kernel"))
    with pytest.raises(RuntimeError, match="moe_permute_indices.*permute_impl='torch'"):
        model(tokens(torch.float32))


def test_bad_config_is_rejected() -> None:
    with pytest.raises(ValueError, match="top_k"):
        MoEConfig(n_experts=4, top_k=5)
    with pytest.raises(ValueError, match="permute_impl"):
        MoEConfig(permute_impl="triton")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- sharded
def _single_device(dtype: torch.dtype) -> tuple[MoE, torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Model, input, cotangent and the single-device results (output, grad x, grads of params).

    Built outside any simulated mesh: under LocalTensorMode even seeded RNG differs per rank.
    """
    model = make(dtype)
    x = tokens(dtype)
    return model, x, tokens(torch.float32, x.shape, seed=7).to(dtype), value_and_grads(model, x)


def _sharded_run(model: MoE, x: torch.Tensor, cot: torch.Tensor, mesh) -> list[torch.Tensor]:
    """Output, grad x and grads of params of the sharded model, as full tensors."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    sharded = shard_moe(copy.deepcopy(model), mesh)
    xd = distribute_tensor(x, mesh, (Shard(0), Replicate())).requires_grad_()
    out = sharded(xd)
    grads = torch.autograd.grad(out, [xd, *sharded.parameters()], distribute_tensor(cot, mesh, out.placements))
    return [t.full_tensor() for t in (out, *grads)]


def _per_rank(t: torch.Tensor) -> list[torch.Tensor]:
    """A simulated (LocalTensor) full tensor holds one copy per rank: check every copy."""
    local = getattr(t, "_local_tensors", None)
    return [local[r] for r in sorted(local)] if local is not None else [t]


def _assert_matches(got: list[torch.Tensor], want: list[torch.Tensor], dtype: torch.dtype) -> None:
    names = ["output", "grad x", *[f"grad {n}" for n, _ in make(dtype).named_parameters()]]
    assert len(got) == len(want) == len(names)
    for name, g, w in ((n, g, w) for n, gs, w in zip(names, got, want) for g in _per_rank(gs)):
        if dtype == torch.float32:
            torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5, msg=lambda m: f"{name}: {m}")
        else:
            # bf16: the sharded run sums TP partials in another order; allow ~2 ulps of the largest value
            tol = 2 * 2**-7 * w.abs().max().item()
            torch.testing.assert_close(g.float(), w.float(), atol=tol, rtol=2e-2, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_sharded_matches_single_device_simulated_2x2(dtype: torch.dtype) -> None:
    from dtensor_rules.testing import simulated_mesh

    model, x, cot, want = _single_device(dtype)
    with simulated_mesh((2, 2), names=("ep", "tp")) as mesh:
        got = _sharded_run(model, x, cot, mesh)
    _assert_matches(got, want, dtype)


def test_sharded_kernel_impl_uneven_tokens_matches_single_device_simulated_2x2() -> None:
    """22 tokens: 11 per 'ep' rank, split 6/5 wherever 'tp' shards them; the permute is the custom op.

    Tokens are 2-D on purpose: with 3-D tokens whose leading dims do not split evenly
    the backward fails in upstream torch 2.13's view rule (view of a (Shard(0), Shard(0))
    (66, 32) gradient to (6, 11, 32) raises "shape ... is invalid"), independent of our rules.
    """
    from dtensor_rules.testing import simulated_mesh

    model = _kernel_twin(make(torch.float32))
    x = tokens(torch.float32, (22, CONFIG.dim))
    cot = tokens(torch.float32, (22, CONFIG.dim), seed=7)
    want = value_and_grads(make(torch.float32), x)  # the torch permute, one device
    with simulated_mesh((2, 2), names=("ep", "tp")) as mesh:
        got = _sharded_run(model, x, cot, mesh)
    _assert_matches(got, want, torch.float32)


@pytest.mark.parametrize("n_tokens", [33, 5, 1, 0])
def test_sharded_uneven_token_counts_match_single_device_simulated_2x2(n_tokens: int) -> None:
    """Token counts the 'ep' ranks cannot split evenly (17/16, 3/2, 1/0 tokens), as MoE batches are,
    and an empty batch (every gradient zero).

    Before ``MoE.flat_assignments`` the block raised "Cannot flatten unevenly sharded tensor"
    here (upstream's view rule), so only token counts divisible by the 'ep' size ran; with 1-D
    column selects the 0-token backward mixed a plain tensor into DTensor math.
    """
    from dtensor_rules.testing import simulated_mesh

    model = make(torch.float32)
    x = tokens(torch.float32, (n_tokens, CONFIG.dim))
    cot = tokens(torch.float32, (n_tokens, CONFIG.dim), seed=7)
    want = value_and_grads(model, x)
    with simulated_mesh((2, 2), names=("ep", "tp")) as mesh:
        got = _sharded_run(model, x, cot, mesh)
    _assert_matches(got, want, torch.float32)


def _gloo_worker(rank: int, world: int, dtype_name: str) -> bool:
    import dtensor_rules  # noqa: F401  (installs the rules in the worker process)
    from torch.distributed.device_mesh import init_device_mesh

    dtype = getattr(torch, dtype_name)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("ep", "tp"))
    model, x, cot, want = _single_device(dtype)
    _assert_matches(_sharded_run(model, x, cot, mesh), want, dtype)
    return True


@pytest.mark.slow
def test_sharded_matches_single_device_gloo_4_ranks() -> None:
    from dtensor_rules.testing import run_gloo

    assert run_gloo(_gloo_worker, 4, "bfloat16", timeout=240) == [True] * 4


# --------------------------------------------------------------------------- coverage
@pytest.mark.parametrize("permute_impl", ["torch", "kernel"])
def test_every_op_of_forward_and_backward_has_a_rule(permute_impl: str) -> None:
    """Ours or upstream's, answering for the traced shapes: no decomposition-only, handler-only or missing op."""
    from dtensor_rules.cli.coverage import coverage

    model = MoE(dataclasses.replace(CONFIG, permute_impl=permute_impl), dtype=torch.bfloat16)
    report = coverage(model, (tokens(torch.bfloat16, (2, 4, 16)),), mesh_shape=(2, 2))
    assert len(report.rows) > 30  # the whole joint graph, not an empty trace
    assert {r.rule for r in report.rows} == {"ours", "upstream"}, [(r.name, r.rule) for r in report.rows if r.rule not in ("ours", "upstream")]
    assert [r.name for r in report.rows if r.strategies == "err"] == []
    ours = {r.name for r in report.rows if r.rule == "ours"}
    assert {"aten._grouped_mm.default", "aten.histc.default", "aten.scatter_add.default"} <= ours
    if permute_impl == "kernel":
        assert "dtensor_rules.moe_permute_indices.default" in ours


def test_coverage_cli_exits_zero_on_2x2(capsys: pytest.CaptureFixture[str]) -> None:
    from dtensor_rules.cli.main import main

    assert main(["coverage", "--mesh", "2x2"]) == 0
    out = capsys.readouterr().out
    assert "0 decomp, 0 handler, 0 none" in out

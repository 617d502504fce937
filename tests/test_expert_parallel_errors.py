"""What ``expert_parallel`` and its neighbours refuse: one error line naming the problem and the fix.

Each case is what a newcomer trips on: the block made expert parallel twice (or after ``shard_moe``),
tokens that are not a DTensor or of another dtype than the router, a mesh with a dim that is not
ep/tp, an adapter class instead of an instance, an adapter missing members, experts that are not
stacked, ``shard_moe`` of a layer that is not the package's MoE, and fp32 experts under
``torch.compile``. Where the input is valid after all (tokens of another dtype under autocast), the
oracle is the same block on one device.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.distributed.tensor import distribute_tensor

import dtensor_rules  # noqa: F401
from dtensor_rules.ep import expert_parallel, token_placements
from dtensor_rules.models import MoE, MoEConfig, shard_moe
from dtensor_rules.ep.adapters import OwnMoEAdapter
from dtensor_rules.ep.local import local_experts
from dtensor_rules.testing import simulated_mesh

CFG = dict(dim=16, hidden=32, n_experts=4, top_k=2)


def _model(**kw) -> MoE:
    return MoE(MoEConfig(**CFG, **kw))


def _tokens(n: int = 10) -> torch.Tensor:
    return torch.randn(n, 16, generator=torch.Generator().manual_seed(0))


def test_expert_parallel_twice_says_the_block_is_already_expert_parallel() -> None:
    with simulated_mesh((2,), names=("ep",)) as mesh:
        ep = expert_parallel(_model(), mesh, tp_dim=None)
        with pytest.raises(ValueError, match=r"MoE is already expert parallel .*its w1 is a DTensor.*unparallelized block"):
            expert_parallel(ep, mesh, tp_dim=None)
        with pytest.raises(ValueError, match="already expert parallel"):
            expert_parallel(ep, mesh, ep_dims=("ep",))
        # the refused call changed nothing: the block still equals one device
        x = _tokens()
        torch.testing.assert_close(ep(distribute_tensor(x, mesh, token_placements(mesh))).full_tensor(), _model()(x),
                                   atol=1e-5, rtol=1e-5)
    with simulated_mesh((2, 1), names=("ep", "tp")) as mesh, pytest.raises(ValueError, match="already expert parallel"):
        expert_parallel(shard_moe(_model(), mesh), mesh)


def test_tokens_that_are_not_a_dtensor_name_token_placements() -> None:
    x = _tokens()  # a plain tensor (made outside the simulated mesh)
    with simulated_mesh((2, 2), names=("ep", "tp")) as mesh:
        ep = expert_parallel(_model(), mesh)
        with pytest.raises(TypeError, match=r"tokens must be a DTensor, got Tensor.*distribute_tensor\(x, mesh, "
                                            r"token_placements\(mesh\)\)"):
            ep(x)
    with simulated_mesh((2,), names=("expert",)) as mesh:
        ep = expert_parallel(_model(), mesh, ep_dim="expert")
        with pytest.raises(TypeError, match=r"token_placements\(mesh, ep_dim='expert'\)"):
            ep(x)
    with simulated_mesh((2, 2), names=("dp_shard", "tp")) as mesh:
        ep = expert_parallel(_model(), mesh, ep_dims=("tp",))
        with pytest.raises(TypeError, match=r"token_placements\(mesh, ep_dims=\('tp',\)\)"):
            ep(x)


def test_tokens_of_another_dtype_name_the_routers_dtype() -> None:
    with simulated_mesh((2,), names=("ep",)) as mesh:
        ep = expert_parallel(_model(), mesh)
        with pytest.raises(TypeError, match=r"tokens are torch.bfloat16 but MoE's router weight gate is torch.float32: "
                                            r"pass torch.float32 tokens"):
            ep(distribute_tensor(_tokens().bfloat16(), mesh, token_placements(mesh)))


def test_under_autocast_tokens_of_another_dtype_pass_and_equal_one_device() -> None:
    """Autocast casts for the router's matmul, so the check stands aside; bf16 experts (gmm_dtype) run there."""
    model = _model(gmm_dtype=torch.bfloat16)
    x = _tokens().bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = model(x)
    with simulated_mesh((2,), names=("ep",)) as mesh:
        ep = expert_parallel(copy.deepcopy(model), mesh)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = ep(distribute_tensor(x, mesh, token_placements(mesh))).full_tensor()
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, atol=2**-6, rtol=2**-6)


def test_a_mesh_with_another_dim_names_the_submesh_consistently() -> None:
    with simulated_mesh((2, 2), names=("dp", "ep")) as mesh:
        for call in (lambda: expert_parallel(_model(), mesh), lambda: token_placements(mesh)):
            with pytest.raises(ValueError) as info:
                call()
            msg = str(info.value)
            assert "dims are 'ep' and optionally 'tp', got dims ('dp', 'ep')" in msg
            assert "'dp' is not an expert-parallel dim: pass the submesh mesh['ep']" in msg and "fully_shard" in msg
        with pytest.raises(ValueError, match=r"dims are 'ep', got dims \('dp', 'ep'\); 'dp' is not"):
            expert_parallel(_model(), mesh, tp_dim=None)
        # the fix the message names works
        expert_parallel(_model(), mesh["ep"])
    with simulated_mesh((2, 2), names=("dp", "tp")) as mesh:
        with pytest.raises(ValueError, match=r"no dim is named 'ep'.*ep_dim=<its name>"):
            expert_parallel(_model(), mesh)


def test_shard_moe_of_another_module_names_the_fix() -> None:
    with simulated_mesh((2, 1), names=("ep", "tp")) as mesh:
        with pytest.raises(TypeError, match=r"shard_moe places this package's MoE.*got Linear.*adapter="):
            shard_moe(nn.Linear(2, 2), mesh)


class _NoInstall:
    """An adapter missing ``install``."""

    def __init__(self, module: MoE) -> None:
        inner = OwnMoEAdapter(module)
        for name in ("module", "n_experts", "hidden", "gmm_dtype", "sum_dtype_is_input"):
            setattr(self, name, getattr(inner, name))
        self.roles, self.experts, self.alignment, self.local_experts = (
            inner.roles, inner.experts, inner.alignment, inner.local_experts)


class _ListExperts(OwnMoEAdapter):
    """An adapter reporting its experts as a ModuleList."""

    def experts(self):  # type: ignore[override]
        return nn.ModuleList(nn.Linear(16, 16) for _ in range(4))


def test_adapter_mistakes_name_the_fix() -> None:
    with simulated_mesh((2,), names=("ep",)) as mesh:
        model = _model()
        with pytest.raises(TypeError, match=r"adapter=OwnMoEAdapter is a class: pass an instance, adapter=OwnMoEAdapter\(module\)"):
            expert_parallel(model, mesh, adapter=OwnMoEAdapter)
        with pytest.raises(TypeError, match=r"adapter=_NoInstall lacks \['install'\] of .*EPAdapter"):
            expert_parallel(model, mesh, adapter=_NoInstall(model))
        with pytest.raises(TypeError, match=r"experts\(\) must be ExpertWeights.*got ModuleList.*stack_experts"):
            expert_parallel(model, mesh, adapter=_ListExperts(model))
        assert not any(isinstance(p, torch.distributed.tensor.DTensor) for p in model.parameters())  # untouched


@pytest.mark.slow  # compiles
def test_fp32_experts_under_compile_name_gmm_dtype() -> None:
    """Compiled ``_grouped_mm`` accepts only bf16: the per-rank expert math refuses float32, naming the fix."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(16, 16, generator=gen)
    offs = torch.tensor([8, 16], dtype=torch.int32)
    ws = [torch.randn(2, 16, 32, generator=gen), torch.randn(2, 16, 32, generator=gen),
          torch.randn(2, 32, 16, generator=gen)]
    torch._dynamo.reset()
    compiled = torch.compile(local_experts, backend="eager", fullgraph=True)
    with pytest.raises(RuntimeError, match=r"routed experts compute in torch.float32.*accepts only torch.bfloat16: "
                                           r"set MoEConfig\(gmm_dtype=torch.bfloat16\)"):
        compiled(x, offs, *ws)
    # the fix: bf16 experts compile and equal eager
    torch.testing.assert_close(compiled(x, offs, *ws, torch.bfloat16), local_experts(x, offs, *ws, torch.bfloat16))
    # the block on one device meets the same check
    with pytest.raises(RuntimeError, match=r"set MoEConfig\(gmm_dtype=torch.bfloat16\)"):
        torch.compile(_model(), backend="eager", fullgraph=True)(_tokens())
    torch._dynamo.reset()

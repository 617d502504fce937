"""A DeepSeekV3-style MoE block written so it traces (make_fx) and runs under DTensor.

Pipeline (T tokens, E experts, k = top_k, A = alignment, L = T*k + E*A):

1. router: ``scores = sigmoid(x @ gate.T)`` (or softmax, ``score_func``); experts picked by
   ``topk(scores + expert_bias)``, optionally node-limited (``n_expert_groups``: models/routing.py)
   (the bias only steers selection: aux-loss-free balancing); weights are the *unbiased*
   scores of the picked experts, optionally normalized to sum 1, times ``route_scale``.
2. counts per expert with ``histc`` (fixed output size, unlike ``bincount`` whose size
   depends on the data); assignments sorted by expert with a stable ``argsort``.
3. padding: each expert's group is rounded up to a multiple of A (at least A rows) so
   every group starts on an aligned row, as CUDA ``_grouped_mm`` needs (A=8 for bf16,
   16 for fp8). The buffer has the fixed size L; the last group absorbs the slack so
   ``offs[-1] == L`` and no row of the buffer is left uninitialized (rows past
   ``offs[-1]`` of a ``_grouped_mm`` output are garbage). Padding rows are zero.
4. routed experts: SwiGLU via ``torch._grouped_mm`` on 3-D weights
   ``w1, w3: (E, dim, hidden)``, ``w2: (E, hidden, dim)`` with int32 ``offs``.
5. combine: each assignment's output times its weight, ``scatter_add`` into its token.
6. plus a shared-expert SwiGLU MLP (hidden ``n_shared * hidden``) on every token.
7. optional (``balance_loss="sequence"|"batch"``, default off): an auxiliary load-balancing
   loss from the router's scores (``routing.balance_loss``), left in ``module.aux_loss`` after
   each forward for the training loop to add to its loss; ``"sequence"`` takes each row of a
   (B, S, dim) input as a sequence (a (T, dim) input is one sequence).

No ``.item()``/``.tolist()``/data-dependent shapes: every buffer size is a Python int
computed from shapes, so the block traces and runs under DTensor. Integer division is
``torch.div(..., rounding_mode="floor")`` rather than ``//`` (``aten.floor_divide``), which
DTensor only handles through a decomposition: every op of forward+backward has a sharding
rule (``python -m dtensor_rules coverage`` lists them; ``tests/test_moe_model.py`` pins 0 without).

``_grouped_mm`` on CPU in torch 2.13: the eager kernel accepts float32 and any offsets
(no alignment requirement), but its meta kernel (used by FakeTensor, make_fx
``tracing_mode="fake"`` and DTensor's output-meta propagation) accepts only bfloat16 and
requires 16-byte aligned strides, i.e. ``dim`` and ``hidden`` multiples of 8 in bf16.
Set ``MoEConfig.gmm_dtype=torch.bfloat16`` to compute the experts in bf16 for any model
dtype (what torchtitan does).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from dtensor_rules.models.routing import balance_loss, node_limited, router_scores

__all__ = ["MoEConfig", "MoE", "alignment_for", "check_compiled_gmm_dtype", "shard_moe"]


def alignment_for(dtype: torch.dtype) -> int:
    """Rows per expert group so each group starts 16 bytes aligned (torchtitan's ALIGN_SIZE_M)."""
    if dtype.itemsize == 1:  # fp8
        return 16
    return 8


def check_compiled_gmm_dtype(dtype: torch.dtype) -> None:
    """Under ``torch.compile``, refuse expert matmuls that are not bf16, naming the fix.

    Compiled code runs ``_grouped_mm``'s meta kernel, which accepts only bf16 inputs on every
    device (eager CPU accepts float32), and would otherwise fail deep in Dynamo's fake-tensor step.
    """
    if dtype != torch.bfloat16 and torch.compiler.is_compiling():
        raise TypeError(
            f"torch.compile: the routed experts compute in {dtype}, but compiled _grouped_mm accepts only "
            "torch.bfloat16: set MoEConfig(gmm_dtype=torch.bfloat16) (the model and tokens may stay float32), "
            "or convert the model and tokens to bf16; eager runs float32 experts"
        )


@dataclass(frozen=True)
class MoEConfig:
    """Sizes and switches of the MoE block; see the module docstring for the pipeline."""

    dim: int = 16
    hidden: int = 32
    n_experts: int = 4
    top_k: int = 2
    n_shared: int = 1
    route_norm: bool = True
    route_scale: float = 1.0
    expert_bias: bool = True
    alignment: int | None = None  # None: alignment_for(dtype of the expert inputs)
    gmm_dtype: torch.dtype | None = None  # None: compute the experts in the input dtype
    permute_impl: Literal["torch", "kernel"] = "torch"
    score_func: Literal["sigmoid", "softmax"] = "sigmoid"
    n_expert_groups: int | None = None  # node-limited routing (models/routing.py): groups of experts
    n_limited_groups: int | None = None  # ... of which each token may pick from this many
    balance_loss: Literal["sequence", "batch"] | None = None  # auxiliary loss (step 7); None: off
    balance_alpha: float = 1e-4  # its weight (DeepSeek-V3 trained with 1e-4)

    def __post_init__(self) -> None:
        if self.score_func not in ("sigmoid", "softmax"):
            raise ValueError(f"score_func={self.score_func!r}: use 'sigmoid' or 'softmax'")
        if self.n_expert_groups is not None:
            if self.n_experts % self.n_expert_groups or self.n_experts // self.n_expert_groups < 2:
                raise ValueError(f"n_expert_groups={self.n_expert_groups} must divide n_experts={self.n_experts} "
                                 "into groups of at least 2 experts")
            if self.n_limited_groups is None or not 1 <= self.n_limited_groups <= self.n_expert_groups:
                raise ValueError(f"n_limited_groups={self.n_limited_groups} must be in 1..n_expert_groups="
                                 f"{self.n_expert_groups} when n_expert_groups is set")
        if not 1 <= self.top_k <= self.n_experts:
            raise ValueError(f"top_k={self.top_k} must be in 1..n_experts={self.n_experts}")
        if self.balance_loss not in (None, "sequence", "batch"):
            raise ValueError(f"balance_loss={self.balance_loss!r}: use None (off), 'sequence' or 'batch'")
        if self.permute_impl not in ("torch", "kernel"):
            raise ValueError(f"permute_impl={self.permute_impl!r}: use 'torch' or 'kernel'")
        if self.alignment is not None and self.alignment < 1:
            raise ValueError(f"alignment={self.alignment} must be >= 1")


class MoE(nn.Module):
    """DeepSeekV3-style MoE block: ``forward(x: (..., dim)) -> (..., dim)``."""

    def __init__(self, config: MoEConfig, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        c = self.config = config
        E, D, H = c.n_experts, c.dim, c.hidden
        self.gate = nn.Parameter(torch.empty(E, D, dtype=dtype))
        self.w1 = nn.Parameter(torch.empty(E, D, H, dtype=dtype))
        self.w3 = nn.Parameter(torch.empty(E, D, H, dtype=dtype))
        self.w2 = nn.Parameter(torch.empty(E, H, D, dtype=dtype))
        Hs = c.n_shared * H
        self.shared_w1 = nn.Parameter(torch.empty(Hs, D, dtype=dtype)) if Hs else None
        self.shared_w3 = nn.Parameter(torch.empty(Hs, D, dtype=dtype)) if Hs else None
        self.shared_w2 = nn.Parameter(torch.empty(D, Hs, dtype=dtype)) if Hs else None
        # not trained by backprop: updated from the counts by the training loop
        self.register_buffer("expert_bias", torch.zeros(E, dtype=torch.float32) if c.expert_bias else None)
        # set by ``expert_parallel``: computes the routed experts instead of ``routed_experts``
        self.routed_region: Callable[[MoE, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None = None
        # the last forward's load-balancing loss (``config.balance_loss``); None when off
        self.aux_loss: torch.Tensor | None = None
        self.init_weights(0)

    def __getstate__(self) -> dict:
        """The module's state without the last forward's loss: it belongs to that forward's autograd
        graph, which ``copy.deepcopy`` and pickling cannot copy; a copy computes its own loss."""
        state = super().__getstate__()
        state["aux_loss"] = None
        return state

    def init_weights(self, seed: int) -> None:
        """Deterministic init from ``seed`` (a private generator; the global RNG is untouched).

        The values are drawn outside any simulated mesh: under ``LocalTensorMode`` a draw from
        one generator runs once per simulated rank and would give every rank other weights.
        """
        from dtensor_rules._upstream import maybe_disable_local_tensor_mode

        g = torch.Generator().manual_seed(seed)
        with maybe_disable_local_tensor_mode():
            values = [torch.randn(p.shape, generator=g, dtype=torch.float32) for p in self.parameters()]
            bias = torch.randn(self.config.n_experts, generator=g) * 0.05
        with torch.no_grad():
            for p, v in zip(self.parameters(), values):
                fan_in = p.shape[-2] if p.ndim == 3 else p.shape[-1]
                p.copy_(v * (1.0 / math.sqrt(fan_in)))
            if self.expert_bias is not None:
                # a visible but small bias, so the selection path is exercised
                self.expert_bias.copy_(bias)

    # ------------------------------------------------------------------ pieces
    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: (T, dim) -> (expert ids (T, k) int64, weights (T, k) in x's dtype)."""
        idx, weights, _ = self._route(x)
        return idx, weights

    def _route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`route` plus the (T, E) float32 scores the balance loss reads."""
        c = self.config
        scores = router_scores(torch.mm(x, self.gate.t()), c.score_func)
        select = scores + self.expert_bias if self.expert_bias is not None else scores
        if c.n_expert_groups is not None:
            select = node_limited(select, c.n_expert_groups, c.n_limited_groups)
        _, idx = torch.topk(select, c.top_k, dim=-1)
        weights = scores.gather(-1, idx)
        if c.route_norm:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return idx, (weights * c.route_scale).to(x.dtype), scores

    def alignment(self, dtype: torch.dtype) -> int:
        return self.config.alignment or alignment_for(dtype)

    def buffer_len(self, n_tokens: int, dtype: torch.dtype) -> int:
        """Fixed padded length L = T*k + E*A: enough for any routing (each group adds < A, or A if empty)."""
        c = self.config
        return n_tokens * c.top_k + c.n_experts * self.alignment(dtype)

    def dispatch(self, idx: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Expert ids (T, k) -> (order (T*k,), dest (T*k,), offs (E,) int32).

        ``order`` lists the flat assignments (:meth:`flat_assignments`: slot-major, ``j*T + t``)
        sorted by expert; the i-th of them goes to row ``dest[i]`` of the padded buffer; ``offs``
        are the group ends.
        """
        c = self.config
        E, A = c.n_experts, self.alignment(dtype)
        n = idx.numel()
        L = self.buffer_len(idx.shape[0], dtype)
        flat = self.flat_assignments(idx)
        order = torch.argsort(flat, stable=True)
        counts = torch.histc(flat.float(), bins=E, min=0, max=E - 1).to(torch.int64)
        if c.permute_impl == "kernel":
            return order, *self._kernel_dest(counts, n, L, A)
        padded = torch.clamp_min(torch.div(counts + A - 1, A, rounding_mode="floor") * A, A)
        ends = torch.cumsum(padded, 0)
        shift = (ends - padded) - (torch.cumsum(counts, 0) - counts)  # padded start - unpadded start
        sorted_expert = flat[order]
        position = torch.cumsum(torch.ones_like(order), 0) - 1  # 0..n-1 without arange
        dest = position + shift[sorted_expert]
        return order, dest, self._offsets(ends, L)

    @staticmethod
    def flat_assignments(per_token: torch.Tensor) -> torch.Tensor:
        """(T, k) -> (k*T,), slot-major: assignment ``j*T + t`` is token t's j-th expert.

        Why not ``per_token.reshape(-1)`` (token-major): with tokens sharded over ranks, that
        flatten is a view DTensor refuses unless every rank holds as many tokens as the others
        ("Cannot flatten unevenly sharded tensor"), and under ``torch.compile`` with an unbacked
        token count it cannot tell. ``per_token.t().reshape(-1)`` runs eagerly but needs a
        symbolic ``_StridedShard`` under compile; ``torch.cat(per_token.unbind(1))`` meets
        upstream's unbind rule, which raises (rather than asking for a redistribution) when a
        solver offers it input sharded on dim 1. Concatenating the k columns works for any token
        count, eager or compiled (``tests/test_moe_compile.py``). They are (T, 1) slices, not 1-D
        selects: autograd's cat backward treats a (0,) input as a legacy empty tensor and hands
        it a plain-tensor gradient, which breaks a DTensor backward with 0 tokens.
        """
        return torch.cat([per_token[:, j : j + 1] for j in range(per_token.shape[1])]).squeeze(1)

    @staticmethod
    def _offsets(ends: torch.Tensor, L: int) -> torch.Tensor:
        """Group ends with the last one stretched to L, as int32 for ``_grouped_mm``."""
        last = ends.new_full((1,), L)
        return torch.cat([ends[:-1], last]).to(torch.int32)

    def _kernel_dest(self, counts: torch.Tensor, n: int, L: int, A: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Same as the torch path, with the padded layout from ``dtensor_rules.kernels``.

        Contract (torchtitan's ``generate_permute_indices``):
        ``moe_permute_indices(tokens_per_expert_group, experts_per_rank, num_ranks, max_len,
        alignment) -> (permuted_indices (max_len,), m_sizes (E,), m_offsets (E,))`` where
        ``permuted_indices[r]`` is the sorted-assignment index stored in padded row r, or -1.
        """
        try:
            from dtensor_rules.kernels import moe_permute_indices
        except ImportError as e:
            raise RuntimeError(
                "MoEConfig(permute_impl='kernel') needs dtensor_rules.kernels.moe_permute_indices, "
                f"which is not available ({e}); use permute_impl='torch'"
            ) from e
        perm, _sizes, m_offsets = moe_permute_indices(counts, self.config.n_experts, 1, L, A)
        perm = perm.to(torch.int64)
        # invert: dest[perm[r]] = r for the real rows; padding rows (-1) write into slot n, dropped
        rows = torch.cumsum(torch.ones_like(perm), 0) - 1
        target = torch.where(perm < 0, torch.full_like(perm, n), perm)
        dest = perm.new_zeros(n + 1).index_put((target,), rows)[:n]
        return dest, self._offsets(m_offsets.to(torch.int64), L)

    def experts(self, x_pad: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        """SwiGLU per expert group on the padded buffer (L, dim) -> (L, dim)."""
        dt = self.config.gmm_dtype
        w1, w3, w2 = self.w1, self.w3, self.w2
        if dt is not None:
            x_pad, w1, w3, w2 = (t.to(dt) for t in (x_pad, w1, w3, w2))
        check_compiled_gmm_dtype(x_pad.dtype)
        h = F.silu(torch._grouped_mm(x_pad, w1, offs=offs)) * torch._grouped_mm(x_pad, w3, offs=offs)
        return torch._grouped_mm(h, w2, offs=offs)

    def shared(self, x: torch.Tensor) -> torch.Tensor:
        if self.shared_w1 is None:
            return torch.zeros_like(x)
        return F.linear(F.silu(F.linear(x, self.shared_w1)) * F.linear(x, self.shared_w3), self.shared_w2)

    # ------------------------------------------------------------------ forward
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (T, dim) stays as it is: even a no-op reshape of a token-sharded DTensor is refused
        # when the token count is unbacked under torch.compile (see flat_assignments)
        flat_tokens = x.ndim != 2
        x2 = x.reshape(-1, self.config.dim) if flat_tokens else x
        idx, weights, scores = self._route(x2)
        c = self.config
        if c.balance_loss is not None:
            seq_len = x.shape[-2] if c.balance_loss == "sequence" and x.ndim >= 3 else None
            self.aux_loss = balance_loss(scores, idx, c.balance_alpha, seq_len)
        region = self.routed_region or MoE.routed_experts
        out = region(self, x2, idx, weights) + self.shared(x2)
        return out.reshape(x.shape) if flat_tokens else out

    def routed_experts(self, x2: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Routed-expert output (T, dim): permute, pad, grouped SwiGLU, weighted combine."""
        c = self.config
        T = x2.shape[0]
        gdt = c.gmm_dtype or x2.dtype
        order, dest, offs = self.dispatch(idx, gdt)
        token = torch.remainder(order, T)  # assignment j*T + t belongs to token t (flat_assignments)
        x_pad = x2.new_zeros(self.buffer_len(T, gdt), c.dim).index_put((dest,), x2[token])
        out_pad = self.experts(x_pad, offs).to(x2.dtype)
        contrib = out_pad[dest] * self.flat_assignments(weights)[order].unsqueeze(-1)
        return x2.new_zeros(T, c.dim).scatter_add(0, token.unsqueeze(-1).expand(-1, c.dim), contrib)


def shard_moe(module: MoE, mesh: torch.distributed.device_mesh.DeviceMesh) -> MoE:
    """Distribute ``module``'s parameters in place on a 2-D mesh ``("ep", "tp")``.

    ==============  ===========  ===========  ==============================================
    parameter       "ep"         "tp"         why
    ==============  ===========  ===========  ==============================================
    w1, w3 (E,D,H)  Shard(0)     Shard(2)     experts split over ep; hidden column-parallel
    w2 (E,H,D)      Shard(0)     Shard(1)     hidden row-parallel: its output is Partial
    gate (E,D)      Replicate    Replicate    every rank routes its own tokens
    shared_w1/w3    Replicate    Shard(0)     colwise Linear (weight (H, D))
    shared_w2       Replicate    Shard(1)     rowwise Linear (weight (D, H)) -> Partial
    expert_bias     Replicate    Replicate    a buffer, read by every rank
    ==============  ===========  ===========  ==============================================

    Tokens are data-parallel: shard the input with ``Shard(0)`` over "ep" (``Replicate`` over "tp").
    DTensor's rules then all-gather experts and tokens; ``expert_parallel`` places the block the
    same way and moves the tokens by all-to-all instead.
    """
    from torch.distributed.tensor import Replicate, Shard

    if not isinstance(module, MoE):
        raise TypeError(f"shard_moe places this package's MoE (dtensor_rules.models.MoE), got {type(module).__qualname__}: "
                        "for another MoE block use expert_parallel(module, mesh, adapter=...) (docs/expert_parallel.md, "
                        "'Any MoE module'); for other layers torch.distributed.tensor.parallel.parallelize_module")
    if mesh.ndim != 2:
        raise ValueError(f"shard_moe needs a 2-D ('ep', 'tp') mesh, got a {mesh.ndim}-D mesh")
    E = module.config.n_experts
    if E % mesh.size(0):
        raise ValueError(f"n_experts={E} must be divisible by the 'ep' mesh size {mesh.size(0)}")
    R = Replicate()
    plan = {
        "w1": (Shard(0), Shard(2)),
        "w3": (Shard(0), Shard(2)),
        "w2": (Shard(0), Shard(1)),
        "gate": (R, R),
        "shared_w1": (R, Shard(0)),
        "shared_w3": (R, Shard(0)),
        "shared_w2": (R, Shard(1)),
    }
    return distribute_params(module, mesh, plan, (R, R))


def distribute_params(module: MoE, mesh: torch.distributed.device_mesh.DeviceMesh,
                      plan: dict[str, tuple], bias_placements: tuple) -> MoE:
    """Replace each parameter named in ``plan`` by a DTensor laid out as planned (in place); the
    routing bias (a buffer, not trained) gets ``bias_placements``.

    On a simulated mesh every rank gets its own copy first (``per_rank_copies``): the module's
    tensors were made outside ``LocalTensorMode``, and a replicated one would otherwise be one
    tensor shared by all simulated ranks, stepped once per rank by an optimizer.
    """
    from torch.distributed.tensor import distribute_tensor

    from dtensor_rules._upstream import per_rank_copies

    for name, placements in plan.items():
        p = getattr(module, name)
        if p is None:
            continue
        local = per_rank_copies(p.detach())
        setattr(module, name, nn.Parameter(distribute_tensor(local, mesh, placements), p.requires_grad))
    if module.expert_bias is not None:
        module.expert_bias = distribute_tensor(per_rank_copies(module.expert_bias), mesh, bias_placements)
    return module

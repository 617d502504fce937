"""torchtitan 0.3.0's trainer with this package's expert-parallel token moves, by one setting.

Activate with torchtitan's override mechanism (no code of your own)::

    torchrun ... -m torchtitan.train --module deepseek_v3 --config deepseek_v3_debugmodel \\
        --parallelism.expert_parallel_degree 4 \\
        --override.imports dtensor_rules.integrations.torchtitan.expert_parallel

    # bf16 token moves for fp32 activations (see below):
    --override.imports 'dtensor_rules.integrations.torchtitan.expert_parallel={"bf16_dispatch": true}'

    # each token sent once per destination rank (see below):
    --override.imports 'dtensor_rules.integrations.torchtitan.expert_parallel={"dispatch": "per_rank"}'

The override replaces every ``AllToAllTokenDispatcher`` (torchtitan's "standard" EP backend) by
:class:`DtensorRulesTokenDispatcher`. Why the dispatcher and nothing else: torchtitan's own
``parallelize`` already lays the MoE block out as :func:`~dtensor_rules.ep.expert_parallel`
does under its mesh model (``ep_dims``: experts ``Shard(0)`` on the ep dims and ``Replicate`` on
efsdp, router replicated, tokens split on every dim), and owns the meta-device build,
``init_weights``, FSDP/HSDP, expert FSDP, tensor parallel of the shared expert, activation
checkpointing and DCP. Keeping those and swapping only what runs inside the routed-experts region
means every one of them composes unchanged, and a run starts from exactly the weights torchtitan's
own EP starts from. Inside the region the rows move by this package's runtime
(:mod:`dtensor_rules.ep.local`): one count exchange, ONE host copy of the split sizes, and
the custom ops ``dtensor_rules::ep_dispatch``/``ep_combine`` (each one opaque node under
``torch.compile``, each the other's backward). torchtitan's ``GroupedExperts`` computes the experts
and torchtitan's combine (fp32 weighting, deterministic ``scatter_add``) sums them, so the
expert math and the per-token sum round exactly as under torchtitan's EP.

``bf16_dispatch`` (default off): tokens leave and expert outputs return as bf16, so do their
gradients. Exact forward, since ``GroupedExperts`` casts its input to bf16 and its bf16 output is
cast back to the tokens' dtype either way; the output gradient is cast to bf16 before the move
instead of after it (the same rounding). The one change: each routed row's token gradient (the sum
of the w1 and w3 paths' bf16 gradients) is rounded to bf16 once before it travels back (fp32 moves
send that sum unrounded): at most 2**-9 relative per element of each row, before torchtitan sums a
token's k rows; every other value (output, routing-score and expert gradients) is unchanged. Halves the
dispatch and combine bytes for fp32 activations; a no-op for bf16 activations.

``dispatch`` (default ``"per_expert"``, torchtitan's rows: one per (token, expert)): ``"per_rank"``
sends each token once per destination rank; that rank weights its experts' outputs as torchtitan's
combine does (each row cast to fp32, times its score, cast back to the tokens' dtype) and sums them
in the tokens' dtype, and ONE row per (token, rank) returns, in the tokens' dtype; the home rank adds
the ranks' partial sums (:func:`dtensor_rules.ep.local.ep_dispatch_per_rank`). Token bytes
each way times ``E[distinct ranks per token] / k``. Not bit-identical to torchtitan's EP: a token's
weighted rows are summed per rank first (another summation order), and with ``index_add`` rather
than torchtitan's ``deterministic_scatter_add``. With ``bf16_dispatch`` the tokens leave as bf16 and
the partial sums return in the tokens' dtype.

With ``--parallelism.expert_parallel_degree 1`` the dispatcher falls back to torchtitan's local
reorder (no EP mesh), as torchtitan's own does. Under torchtitan's ``SelectiveAC`` the two moves
are recomputed in the backward (its save list names ``all_to_all_single``, not these ops); add
``dtensor_rules.integrations.torchtitan.selective_ac`` to ``--override.imports`` to save them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torchtitan.config import override
from torchtitan.distributed.activation_checkpoint import SelectiveAC
from torchtitan.models.common.token_dispatcher import (
    AllToAllTokenDispatcher,
    LocalDispatchMetadata,
    LocalTokenDispatcher,
)

from dtensor_rules.ep.all_to_all import count_under_comm_debug_mode, ep_combine_op
from dtensor_rules.ep.local import (
    Dispatched,
    RankDispatched,
    check_dispatch,
    ep_combine_per_rank,
    ep_dispatch,
    ep_dispatch_per_rank,
)

__all__ = ["DtensorRulesTokenDispatcher", "DtensorRulesSelectiveAC", "expert_parallel", "selective_ac"]

# rows per expert group: 1, torchtitan's own layout (its all-to-all path pads nothing), so each
# expert multiplies exactly the rows torchtitan's would, in the same order
_ALIGNMENT = 1


@dataclass(frozen=True, kw_only=True)
class DtensorRulesDispatchMetadata(LocalDispatchMetadata):
    """What the combine needs: the dispatch's state plus torchtitan's combine inputs."""

    dispatched: Dispatched | RankDispatched


class DtensorRulesTokenDispatcher(AllToAllTokenDispatcher):
    """``AllToAllTokenDispatcher`` whose token moves are this package's (module docstring)."""

    @dataclass(kw_only=True, slots=True)
    class Config(AllToAllTokenDispatcher.Config):
        bf16_dispatch: bool = False
        """Move tokens, expert outputs and their gradients as bf16 (module docstring: numerics)."""
        dispatch: str = "per_expert"
        """``"per_rank"``: each token once per destination rank (module docstring: numerics)."""

    def __init__(self, config: Config):
        super().__init__(config)
        check_dispatch(config.dispatch)
        self.bf16_dispatch = config.bf16_dispatch
        self.per_rank = config.dispatch == "per_rank"

    def dispatch(self, x_TD: torch.Tensor, topk_scores_TK: torch.Tensor, topk_expert_ids_TK: torch.Tensor,
                 num_local_tokens_per_expert_E: torch.Tensor):
        if self.ep_mesh is None:
            return LocalTokenDispatcher.dispatch(self, x_TD, topk_scores_TK, topk_expert_ids_TK,
                                                 num_local_tokens_per_expert_E)
        x_send = x_TD.to(torch.bfloat16) if self.bf16_dispatch else x_TD
        if self.per_rank:
            r = ep_dispatch_per_rank(x_send, topk_expert_ids_TK, topk_scores_TK, self.num_experts, _ALIGNMENT,
                                     self.ep_mesh.get_group())
            metadata = DtensorRulesDispatchMetadata(
                token_indices_experts_sorted_N=r.token, topk_scores_experts_sorted_N=r.weight, dispatched=r)
            return r.x_grouped, torch.diff(r.offs, prepend=r.offs.new_zeros(1)), metadata
        d = ep_dispatch(x_send, topk_expert_ids_TK, self.num_experts, _ALIGNMENT, self.ep_mesh.get_group())
        # group sizes for GroupedExperts (it takes their cumsum: our group ends)
        sizes = torch.diff(d.offs, prepend=d.offs.new_zeros(1))
        metadata = DtensorRulesDispatchMetadata(
            token_indices_experts_sorted_N=torch.div(d.order, self.top_k, rounding_mode="floor"),
            topk_scores_experts_sorted_N=topk_scores_TK.reshape(-1)[d.order],
            dispatched=d,
        )
        return d.x_grouped, sizes, metadata

    def combine(self, routed_output_RD: torch.Tensor, metadata: LocalDispatchMetadata,
                x_TD: torch.Tensor) -> torch.Tensor:
        if not isinstance(metadata, DtensorRulesDispatchMetadata):
            return LocalTokenDispatcher.combine(self, routed_output_RD, metadata, x_TD)
        d = metadata.dispatched
        if isinstance(d, RankDispatched):
            # torchtitan's rounding (fp32 product, cast to the tokens' dtype, summed in it) per rank
            y = routed_output_RD.to(x_TD.dtype)
            return ep_combine_per_rank(y, d, x_TD.shape[0], sum_dtype=x_TD.dtype).to(x_TD.dtype)
        count_under_comm_debug_mode()
        back = ep_combine_op(routed_output_RD[d.dest], d.splits, d.group.group_name, d.order.shape[0])
        # torchtitan's combine (fp32 weighting, scatter_add in the tokens' dtype) on the rows in
        # its own expert-sorted order; bf16 rows are cast back first (exact) so the weighted rows
        # round as with fp32 moves
        return LocalTokenDispatcher.combine(self, back.to(x_TD.dtype), metadata, x_TD)


@override(target=AllToAllTokenDispatcher.Config, exact=True,
          description="dtensor_rules expert-parallel token moves (custom ops, one host sync)")
def expert_parallel(cfg: AllToAllTokenDispatcher.Config, *, bf16_dispatch: bool = False,
                    dispatch: str = "per_expert") -> DtensorRulesTokenDispatcher.Config:
    return DtensorRulesTokenDispatcher.Config(num_experts=cfg.num_experts, top_k=cfg.top_k,
                                              bf16_dispatch=bf16_dispatch, dispatch=dispatch)


class DtensorRulesSelectiveAC(SelectiveAC):
    """torchtitan's ``SelectiveAC`` that also saves the outputs of the two token moves."""

    @dataclass(kw_only=True, slots=True)
    class Config(SelectiveAC.Config):
        pass

    def get_save_ops(self) -> set:
        return super().get_save_ops() | {torch.ops.dtensor_rules.ep_dispatch.default,
                                         torch.ops.dtensor_rules.ep_combine.default}


@override(target=SelectiveAC.Config, exact=True,
          description="SelectiveAC saving dtensor_rules' token moves instead of recomputing them")
def selective_ac(cfg: SelectiveAC.Config) -> DtensorRulesSelectiveAC.Config:
    return DtensorRulesSelectiveAC.Config(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)
                                             if f.init})

"""Token-choice top-k routing pieces, written to equal torchtitan 0.3.0's ``TokenChoiceTopKRouter``.

- :func:`router_scores`: ``sigmoid`` or ``softmax`` of the gate logits, in float32;
- :func:`node_limited`: DeepSeek-V3's group-limited routing: experts form ``n_groups`` groups, a
  group scores the sum of its top-2 experts, and only the ``n_limited`` best groups stay
  selectable (the others' scores become -inf before the top-k);
- :func:`tokens_per_expert`: how many (token, slot) assignments each expert got (torchtitan's
  ``routing_map.sum``), what the auxiliary-loss-free balancing reads;
- :func:`expert_bias_delta`: that balancing's update, as torchtitan's optimizer pre-hook applies it:
  ``coeff * sign(mean(counts) - counts)``, centred to mean 0;
- :func:`balance_loss`: an optional auxiliary load-balancing loss (torchtitan 0.3.0 has none):
  DeepSeek-V3's sequence-wise one (paper eq. 17-20) or the switch-style batch one.

Every piece is plain torch ops with shapes fixed by the inputs (no ``.item()``): they run on
DTensors under the package's rules and trace with ``make_fx``.
"""

from __future__ import annotations

import torch

__all__ = ["router_scores", "node_limited", "tokens_per_expert", "expert_bias_delta", "balance_loss"]


def router_scores(logits: torch.Tensor, score_func: str) -> torch.Tensor:
    """(T, E) gate logits -> float32 scores."""
    logits = logits.float()
    if score_func == "sigmoid":
        return torch.sigmoid(logits)
    if score_func == "softmax":
        return torch.softmax(logits, dim=-1)
    raise ValueError(f"score_func={score_func!r}: use 'sigmoid' or 'softmax'")


def node_limited(select: torch.Tensor, n_groups: int, n_limited: int) -> torch.Tensor:
    """(..., E) selection scores with every expert outside the ``n_limited`` best groups set to -inf."""
    E = select.shape[-1]
    if E % n_groups or E // n_groups < 2:
        raise ValueError(f"n_expert_groups={n_groups} must divide n_experts={E} into groups of at least 2")
    grouped = select.unflatten(-1, (n_groups, E // n_groups))
    group_scores = grouped.topk(2, dim=-1)[0].sum(dim=-1)
    _, group_idx = torch.topk(group_scores, k=n_limited, dim=-1, sorted=False)
    dropped = torch.ones_like(group_scores, dtype=torch.bool).scatter(-1, group_idx, False)
    return grouped.masked_fill(dropped.unsqueeze(-1), float("-inf")).flatten(-2)


def tokens_per_expert(idx: torch.Tensor, n_experts: int) -> torch.Tensor:
    """(..., k) expert ids -> (E,) float32 assignment counts."""
    flat = idx.reshape(-1, idx.shape[-1])
    onehot = torch.zeros(flat.shape[0], n_experts, dtype=torch.bool, device=idx.device).scatter(-1, flat, True)
    return onehot.sum(dim=0).float()


def expert_bias_delta(counts: torch.Tensor, coeff: float) -> torch.Tensor:
    """The auxiliary-loss-free bias step for (E,) counts: under-used experts up, over-used down."""
    delta = coeff * torch.sign(counts.float().mean() - counts.float())
    return delta - delta.mean()


def balance_loss(scores: torch.Tensor, idx: torch.Tensor, alpha: float, seq_len: int | None = None) -> torch.Tensor:
    """``alpha * sum_i f_i * P_i`` for (T, E) router affinities ``scores`` and (T, k) chosen ids ``idx``.

    DeepSeek-V3 (arXiv 2412.19437, eq. 17-20), per sequence of ``seq_len`` consecutive tokens,
    averaged over the T / seq_len sequences:

    - ``f_i = E / (k * S) * #{t : token t routed to expert i}`` (1 for every expert when balanced);
    - ``P_i = 1/S * sum_t s'_{i,t}``, ``s' = scores / scores.sum(-1)`` (softmax scores are already
      normalized; sigmoid ones are not).

    ``seq_len=None``: the whole batch is one sequence, i.e. the Switch Transformer loss
    ``alpha * E * sum_i frac_i * P_i`` with ``frac_i`` the share of the T*k assignments (top-k
    generalised; = alpha when balanced). The indicator counts the experts a token is actually sent
    to (top-k of ``scores + expert_bias``, node-limited): with no bias this is eq. 18 to the letter.
    Only ``P`` carries a gradient (the indicator is a count), so the loss trains the router alone.
    Plain torch ops on the global token dim: on token-sharded DTensors the sums over tokens are
    global (every rank gets the loss of the whole batch, not of its own tokens).
    """
    T, E = scores.shape
    k = idx.shape[-1]
    if T == 0:  # no tokens: nothing to balance (the graph to the router is kept)
        return scores.sum() * 0.0
    S = T if seq_len is None else seq_len
    if S < 1 or T % S:
        raise ValueError(f"balance_loss: {T} tokens do not split into sequences of {S} tokens")
    probs = scores / scores.sum(-1, keepdim=True)
    chosen = torch.zeros_like(scores).scatter(-1, idx, 1.0)
    per_seq = (T // S, S, E)
    f = chosen.reshape(per_seq).sum(dim=1) * (E / (k * S))
    P = probs.reshape(per_seq).mean(dim=1)
    return alpha * (f * P).sum(dim=-1).mean()

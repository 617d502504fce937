"""The routed experts of an MoE block as ONE ``torch.library`` custom op, so a solver sees them as one node.

- ``dtensor_rules::routed_experts(x, idx, weights, w1, w3, w2, n_experts, alignment, gmm_dtype=None)``
  -> ``(T, D)``: each token's top-k expert outputs (SwiGLU, ``w1``/``w3`` ``(E, D, H)``, ``w2``
  ``(E, H, D)``) summed with its routing weights; ``x`` ``(T, D)``, ``idx`` ``(T, k)`` global expert
  ids, ``weights`` ``(T, k)``.
- ``dtensor_rules::routed_experts_backward(grad, x, idx, weights, w1, w3, w2, ...)`` -> the
  gradients of ``x``, ``weights``, ``w1``, ``w3``, ``w2``: the forward's autograd formula, its own
  op so a traced training step holds one backward node too.

Why an op: a solver that enumerates DTensor strategies per op of a traced joint graph (this
package's ``solver``, AutoParallel) only chooses among the rows one node's rule offers. Traced
as aten ops (sort, gather, ``_grouped_mm`` with offsets, scatter) no single node can say
"experts ``Shard(0)``, tokens sent to their owners"; as one op its rule can
(``dtensor_rules/ep/routed_experts_rule.py``), and a solver picks expert parallelism like any other row.

What the kernel computes: every expert of ``w1`` on this call's tokens, on plain tensors. That is
the op's meaning on one device and under every layout whose rows run the op on each rank's
shards (tokens split, expert hidden dim split, replicated). Under the expert-parallel row the
experts are split BY EXPERT (``w1.shape[0] < n_experts``) and the tokens must travel to the
ranks owning their experts, which a kernel on local shards cannot do (it names no process
group): the kernel refuses it, naming the runtime that does it (``expert_parallel``,
``solver.apply_choice``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

from dtensor_rules.kernels import moe_permute_indices, permuted_length_bound

__all__ = ["ROUTED_EXPERTS_NAME", "ROUTED_EXPERTS_BACKWARD_NAME", "routed_experts_op", "routed_experts_backward_op",
           "routed_experts_local", "routed_experts_grads"]

ROUTED_EXPERTS_NAME = "dtensor_rules::routed_experts"
ROUTED_EXPERTS_BACKWARD_NAME = "dtensor_rules::routed_experts_backward"


class _Grouped(NamedTuple):
    """The assignments grouped per expert, padded (``_grouped_mm``'s layout), and the way back."""

    token: Tensor  # (n,) the token of each sorted assignment
    order: Tensor  # (n,) the flat (token-major) assignment of each sorted one
    dest: Tensor  # (n,) the padded row of each sorted assignment
    perm: Tensor  # (max_len,) the sorted assignment in each padded row, -1 for padding
    offs: Tensor  # (E,) int32 group ends


def _check_experts(w1: Tensor, n_experts: int) -> None:
    if w1.shape[0] != n_experts:
        raise ValueError(
            f"routed_experts got {w1.shape[0]} of n_experts={n_experts} experts: the experts are split by expert "
            "(the expert-parallel layout), so tokens must travel to the ranks owning their experts, which the op on "
            "local shards cannot do; run that layout with dtensor_rules.ep.expert_parallel "
            "(dtensor_rules.solver.apply_choice builds it from a solver's choice)")


def _group(idx: Tensor, n_experts: int, alignment: int) -> _Grouped:
    k = idx.shape[-1]
    flat = idx.reshape(-1)
    n = flat.numel()
    order = torch.argsort(flat, stable=True)
    counts = flat.new_zeros(n_experts).scatter_add_(0, flat, torch.ones_like(flat))
    max_len = permuted_length_bound(n, n_experts, alignment)
    perm, _sizes, offs = moe_permute_indices(counts, n_experts, 1, max_len, alignment)
    perm = perm.to(torch.int64)
    slots = torch.arange(max_len, dtype=torch.int64, device=perm.device)
    target = torch.where(perm < 0, torch.full_like(perm, n), perm)  # padding writes slot n, dropped
    dest = perm.new_zeros(n + 1).index_put((target,), slots)[:n]
    return _Grouped(torch.div(order, k, rounding_mode="floor"), order, dest, perm, offs)


def _gathered(x: Tensor, g: _Grouped) -> Tensor:
    rows = x[g.token]
    return torch.cat([rows, rows.new_zeros(1, x.shape[-1])])[g.perm]  # padding slots (-1) read the zero row


def routed_experts_local(x: Tensor, idx: Tensor, weights: Tensor, w1: Tensor, w3: Tensor, w2: Tensor,
                         n_experts: int, alignment: int, gmm_dtype: torch.dtype | None = None) -> Tensor:
    """The op's math on plain tensors holding every expert: group the assignments per expert
    (padded to ``alignment`` rows, ``_grouped_mm``'s layout), SwiGLU, weighted sum per token."""
    from dtensor_rules.ep.local import local_experts

    _check_experts(w1, n_experts)
    g = _group(idx, n_experts, alignment)
    y = local_experts(_gathered(x, g), g.offs, w1, w3, w2, gmm_dtype)
    contrib = y[g.dest].to(weights.dtype) * weights.reshape(-1)[g.order].unsqueeze(-1)
    return contrib.new_zeros(x.shape).index_add(0, g.token, contrib).to(x.dtype)


def routed_experts_grads(grad: Tensor, x: Tensor, idx: Tensor, weights: Tensor, w1: Tensor, w3: Tensor, w2: Tensor,
                         n_experts: int, alignment: int, gmm_dtype: torch.dtype | None = None
                         ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Gradients of :func:`routed_experts_local` w.r.t. ``x, weights, w1, w3, w2``, written out (a
    custom op's kernel runs below autograd, and ``torch.func`` cannot wrap a simulated rank's
    LocalTensor): the combine's and SwiGLU's chain rule, the grouped matmuls' input gradients
    (``_grouped_mm`` with the transposed experts) and weight gradients (2-D x 2-D with ``offs``)."""
    _check_experts(w1, n_experts)
    gdt = gmm_dtype or x.dtype
    g = _group(idx, n_experts, alignment)
    xg, a1, a3, a2 = (t.to(gdt) for t in (_gathered(x, g), w1, w3, w2))
    h1 = torch._grouped_mm(xg, a1, offs=g.offs)
    h3 = torch._grouped_mm(xg, a3, offs=g.offs)
    act = torch.nn.functional.silu(h1)
    y = torch._grouped_mm(act * h3, a2, offs=g.offs)
    w_sel = weights.reshape(-1)[g.order].unsqueeze(-1)
    g_rows = grad.to(weights.dtype)[g.token]  # d out / d contrib, per sorted assignment
    g_w_sel = (y[g.dest].to(weights.dtype) * g_rows).sum(-1)
    g_weights = g_w_sel.new_zeros(g_w_sel.shape).index_put((g.order,), g_w_sel).view(weights.shape)
    g_y = (g_rows * w_sel).to(gdt).new_zeros(y.shape).index_put((g.dest,), (g_rows * w_sel).to(gdt))
    g_a = torch._grouped_mm(g_y, a2.transpose(-2, -1), offs=g.offs)
    sig = torch.sigmoid(h1)
    g_h1 = g_a * h3 * sig * (1 + h1 * (1 - sig))
    g_h3 = g_a * act
    g_xg = torch._grouped_mm(g_h1, a1.transpose(-2, -1), offs=g.offs) + torch._grouped_mm(g_h3, a3.transpose(-2, -1),
                                                                                      offs=g.offs)
    g_w1 = torch._grouped_mm(xg.t(), g_h1, offs=g.offs)
    g_w3 = torch._grouped_mm(xg.t(), g_h3, offs=g.offs)
    g_w2 = torch._grouped_mm((act * h3).t(), g_y, offs=g.offs)
    g_x = x.new_zeros(x.shape).index_add(0, g.token, g_xg[g.dest].to(x.dtype))
    return g_x, g_weights.to(weights.dtype), g_w1.to(w1.dtype), g_w3.to(w3.dtype), g_w2.to(w2.dtype)


@torch.library.custom_op(ROUTED_EXPERTS_NAME, mutates_args=())
def routed_experts_op(x: Tensor, idx: Tensor, weights: Tensor, w1: Tensor, w3: Tensor, w2: Tensor,
                      n_experts: int, alignment: int, gmm_dtype: torch.dtype | None = None) -> Tensor:
    """Module docstring; :func:`routed_experts_local` is the math."""
    return routed_experts_local(x, idx, weights, w1, w3, w2, n_experts, alignment, gmm_dtype)


@torch.library.custom_op(ROUTED_EXPERTS_BACKWARD_NAME, mutates_args=())
def routed_experts_backward_op(grad: Tensor, x: Tensor, idx: Tensor, weights: Tensor, w1: Tensor, w3: Tensor,
                               w2: Tensor, n_experts: int, alignment: int, gmm_dtype: torch.dtype | None = None
                               ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Gradients of ``x, weights, w1, w3, w2`` (:func:`routed_experts_grads`)."""
    return routed_experts_grads(grad, x, idx, weights, w1, w3, w2, n_experts, alignment, gmm_dtype)


@routed_experts_op.register_fake
def _fake(x: Tensor, idx: Tensor, weights: Tensor, w1: Tensor, w3: Tensor, w2: Tensor, n_experts: int,
          alignment: int, gmm_dtype: torch.dtype | None = None) -> Tensor:
    return x.new_empty(x.shape)  # any expert count: a solver prices the EP row by running this at local shapes


@routed_experts_backward_op.register_fake
def _fake_backward(grad: Tensor, x: Tensor, idx: Tensor, weights: Tensor, w1: Tensor, w3: Tensor, w2: Tensor,
                   n_experts: int, alignment: int, gmm_dtype: torch.dtype | None = None
                   ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    return tuple(t.new_empty(t.shape) for t in (x, weights, w1, w3, w2))  # type: ignore[return-value]


def _setup(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    ctx.save_for_backward(*inputs[:6])
    ctx.static = inputs[6:]


def _backward(ctx: Any, grad: Tensor) -> tuple[Any, ...]:
    x, idx, weights, w1, w3, w2 = ctx.saved_tensors
    gx, gw, g1, g3, g2 = routed_experts_backward_op(grad, x, idx, weights, w1, w3, w2, *ctx.static)
    return (gx, None, gw, g1, g3, g2) + (None,) * len(ctx.static)


routed_experts_op.register_autograd(_backward, setup_context=_setup)

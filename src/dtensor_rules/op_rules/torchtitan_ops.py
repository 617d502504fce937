"""DTensor rules for torchtitan 0.3.0's own ``torch.library`` ops, registered when torchtitan defines them.

torchtitan (an optional extra) defines 10 ops in its ``torchtitan::`` namespace; none has a
DTensor rule upstream, so its MoE written on DTensors stops at the first one
(``deterministic_scatter_add``: "does not have a sharding strategy registered"). Covered here:

======================================  =====================================  =====================================
op                                      module that defines it                 here
======================================  =====================================  =====================================
deterministic_scatter_add               torchtitan.ops.scatter_add             rule, cost, samples
silu_and_mul                            torchtitan.overrides.fused_swiglu      rule, cost, samples (CUDA-only op)
silu_and_mul_backward                   torchtitan.overrides.fused_swiglu      rule, cost, samples (CUDA-only op)
fused_mla_k_rope                        torchtitan.overrides.fused_mla         rule, cost, samples (CUDA-only op)
fused_mla_kv_backward                   torchtitan.overrides.fused_mla         rule, cost, samples (CUDA-only op)
fused_mla_q_rope_                       torchtitan.overrides.fused_mla         rule, cost, samples (CUDA-only, in place)
helion_{cossin,complex}_rope_{fwd,bwd}  torchtitan.overrides.helion_rope       rule, cost, samples (CUDA-only; defined
                                                                               only where helion is installed)
======================================  =====================================  =====================================

deterministic_scatter_add(out, index, src) = ``out.scatter_add(0, index, src)`` with
deterministic algorithms on: exactly aten.scatter_add with ``dim=0``, so it takes that rule's
rows (``[result, out, index, src]``, docstring of :mod:`dtensor_rules.op_rules.gather_scatter`):

=======================  =====================  ==========================================================
result                   out, index, src        why it is valid
=======================  =====================  ==========================================================
S(d), d != 0             S(d), S(d), S(d)       only if out, index and src have equal size on d
P(sum)                   P(sum), R, P(sum)      linear in (out, src) jointly
P(sum)                   P(sum), S(0), S(0)     only if index.size(0) == src.size(0): each rank adds its
                                                rows of src (the MoE combine: tokens sharded over ranks)
P(avg)                   P(avg)|R, R, P(avg)|R  affine (not both R)
P(max) / P(min)          P(op), R, R            out + c with c identical on all ranks: monotone
=======================  =====================  ==========================================================

silu_and_mul(gate, up, offsets=None) = ``silu(gate) * up`` in float32, cast to gate's dtype,
for the rows before ``offsets[-1]`` (later rows are not written: whatever the output held, so no
layout may make a rank compute rows the single device does not, nor skip rows it does) —
``[out, gate, up(, offsets)]``; offsets is always R (its values are global row numbers):

=======================  =====================  ==========================================================
out                      gate, up (offsets)     why it is valid
=======================  =====================  ==========================================================
S(0)                     S(0), S(0)             rows are independent; only WITHOUT offsets (a row limit
                                                is a global row number: a shard would shift it)
S(1)                     S(1), S(1) (R)         columns are independent; offsets stay global rows
P(sum) / P(avg)          R, P(op) (R)           linear in up: silu(g) * sum_r(u_r) = sum_r(silu(g) * u_r)
=======================  =====================  ==========================================================

silu_and_mul_backward(grad, gate, up, offsets=None) -> (grad_gate, grad_up), with
``grad_gate = grad * up * silu'(gate)`` and ``grad_up = grad * silu(gate)`` —
``[grad_gate, grad_up, grad, gate, up(, offsets)]``:

=======================  =====================  ==========================================================
grad_gate, grad_up       grad, gate, up         why it is valid
=======================  =====================  ==========================================================
S(0), S(0)               S(0), S(0), S(0)       rows are independent; only without offsets
S(1), S(1)               S(1), S(1), S(1)       columns are independent (offsets R)
P(op), P(op)             P(op), R, R            both outputs are linear in grad (op sum or avg)
P(op), R|P(avg|max|min)  R, R, P(op)            grad_gate is linear in up; grad_up does not read up, so
                                                it is identical on every rank (R, or any mean/max/min)
=======================  =====================  ==========================================================

fused_mla_k_rope(kv (B, L, H, nope + V), k_pe (B, L, R), cache (M, R/2, 2), positions (B, L),
q_nope_dim) -> k (B, L, H, nope + R): ``k[..., :nope] = kv[..., :nope]``, ``k[..., nope:]`` = k_pe
rotated by the rope of ``positions`` (the same for every head) — ``[k, kv, k_pe, cache, positions]``:

=======================  =====================  ==========================================================
k                        kv, k_pe, cache, pos   why it is valid
=======================  =====================  ==========================================================
S(0) / S(1)              S(d), S(d), R, S(d)    tokens (batch / sequence) are independent
S(2)                     S(2), R, R, R          heads are independent; every head reads the whole k_pe
P(sum)                   P, P, R, R             linear in (kv, k_pe) jointly (the rotation is linear)
P(avg)                   P|R, R|P, R, R         affine: the mean of a replicated operand is itself
=======================  =====================  ==========================================================

fused_mla_kv_backward(grad_k (B, L, H, nope + R), grad_v (B, L, H, V), cache, positions,
q_nope_dim, rope_dim) -> (grad_kv = cat(grad_k[..., :nope], grad_v), grad_k_pe = inverse rope of
grad_k[..., nope:] summed over heads) — ``[grad_kv, grad_k_pe, grad_k, grad_v, cache, positions]``:

=======================  =====================  ==========================================================
grad_kv, grad_k_pe       grad_k, grad_v, ...    why it is valid
=======================  =====================  ==========================================================
S(0), S(0) / S(1), S(1)  S(d), S(d), R, S(d)    tokens are independent
S(2), P(sum)             S(2), S(2), R, R       heads: grad_k_pe sums over heads, so each rank's is a part
                                                (a bf16/fp16 sum is rounded per rank, then summed)
P(op), P(op)             P(op), P(op), R, R     linear in (grad_k, grad_v) jointly (op sum or avg)
P(avg), R|P(avg|max|min) R, P(avg), R, R        grad_k_pe does not read grad_v: identical on every rank
P(avg), P(avg)           P(avg), R, R, R        affine in grad_k for the mean
=======================  =====================  ==========================================================

fused_mla_q_rope_(q (B, L, H, nope + R), cache, positions (B, L), q_nope_dim, inverse) -> q, in
place: ``q[..., nope:]`` rotated (``inverse``: rotated back, its backward) by the rope of
``positions``, the same for every head; ``q[..., :nope]`` untouched — ``[q (result), q, cache,
positions]``. The result IS ``self``, so every row keeps q's placement for the result (DTensor
refuses an in-place op that would change it):

=======================  =====================  ==========================================================
result = q               q, cache, positions    why it is valid
=======================  =====================  ==========================================================
S(0) / S(1)              S(d), R, S(d)          tokens (batch / sequence) are independent
S(2)                     S(2), R, R             heads are independent (positions are per token)
P(sum) / P(avg)          P(op), R, R            linear in q (the rotation is linear; nope part identity)
=======================  =====================  ==========================================================

helion_{cossin,complex}_rope_{fwd,bwd}(xq (B, L, H, D), xk (B, L, Hk, D), cache, positions (B, L))
-> (xq_out, xk_out): each of xq and xk rotated (bwd: rotated back) per token by the rope of its
position, the same for every head (cossin: rotate-half with a (M, 2D) cos|sin cache; complex:
adjacent pairs with a (M, D/2, 2) cache). xq_out reads only xq, xk_out only xk, so the two pairs
place independently — ``[xq_out, xk_out, xq, xk, cache, positions]``:

=======================  =====================  ==========================================================
xq_out, xk_out           xq, xk, cache, pos     why it is valid
=======================  =====================  ==========================================================
S(0), S(0) / S(1), S(1)  S(d), S(d), R, S(d)    tokens are independent (both read the same positions)
a, b                     a, b, R, R             a, b each R, S(2) (heads), P(sum) or P(avg) (linear), not
                                                both R: a pair's output depends on its own input only
=======================  =====================  ==========================================================

Not offered. silu ops: gate Partial (silu is not linear), P(max/min) (the other factor's sign
flips the order), S(0) with offsets (above). MLA ops: P(max/min) (the rotation mixes signs), a
shard of the last dim (rope pairs, the nope/rope split; helion: the rotate-half halves), the cache sharded or Partial (a lookup
table indexed by position). Partial rows need floating inputs (``partial_ops``).

Registration: a post-import hook (:func:`dtensor_rules._upstream.post_import.when_imported`) on each
defining module, the named patch ``torchtitan_rules`` (``dtensor_rules/deferred_rules.py``, docs/patches.md). Before torchtitan is
imported, ``status().deferred`` lists the ten rules as waiting, like ``prims.fma``; importing
the module registers the rule (and installs it if the package's rules are installed).

Samples: uneven row counts, duplicate indices, bf16, offsets that stop before the last row (rows
past ``offsets[-1]`` are unwritten by the CUDA kernel; the CPU reference kernel of
tests/test_torchtitan_ops.py zeroes them).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch
from torch._ops import OpOverload
from torch.distributed.tensor.placement_types import Partial, Placement, Replicate, Shard

from dtensor_rules.costs.op_cost import OpCost
from dtensor_rules.op_rules._common import generator, metas, PlacementOrHole, Samples
from dtensor_rules.op_rules._partial import partial_ops
from dtensor_rules.op_rules.gather_scatter import scatter_add_strategy, scatter_cost

__all__ = ["TORCHTITAN_OPS", "deterministic_scatter_add_strategy", "silu_and_mul_strategy",
           "silu_and_mul_backward_strategy", "fused_mla_k_rope_strategy", "fused_mla_kv_backward_strategy",
           "fused_mla_q_rope_strategy", "helion_rope_strategy"]

Row = list[PlacementOrHole]
R: Placement = Replicate()
SCATTER_ADD = "torchtitan.ops.scatter_add"
FUSED_SWIGLU = "torchtitan.overrides.fused_swiglu"
FUSED_MLA = "torchtitan.overrides.fused_mla"
HELION_ROPE = "torchtitan.overrides.helion_rope"  # defines its ops only where helion imports


# --------------------------------------------------------------------------- sample suites

def _r(g: torch.Generator, *shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=g).to(dtype)


def deterministic_scatter_add_samples() -> Samples:
    """The MoE combine: (T, D) zeros, (N, D) token ids expanded over D, (N, D) weighted expert rows."""
    g = generator(60)
    out = []
    for T, N, D, dtype in ((5, 10, 6, torch.float32), (7, 9, 4, torch.bfloat16), (3, 5, 3, torch.float32)):
        ids = torch.randint(0, T, (N, 1), generator=g).expand(N, D).contiguous()
        out.append(((_r(g, T, D, dtype=dtype), ids, _r(g, N, D, dtype=dtype)), {}))
    return out


def silu_and_mul_samples() -> Samples:
    g = generator(61)
    return [
        ((_r(g, 5, 6), _r(g, 5, 6)), {}),
        # a small gate: the validator's P(max) pieces sit (2 span + 1) below it, and silu of a large
        # negative number is ~0, which would let a wrong (P(max) gate -> P(sum)) claim pass in bf16
        ((_r(g, 7, 4, dtype=torch.bfloat16) * 0.2, _r(g, 7, 4, dtype=torch.bfloat16)), {}),
        ((_r(g, 6, 5), _r(g, 6, 5), torch.tensor([2, 4], dtype=torch.int32)), {}),  # rows 4, 5 not computed
    ]


def silu_and_mul_backward_samples() -> Samples:
    g = generator(62)
    return [
        ((_r(g, 5, 6), _r(g, 5, 6), _r(g, 5, 6)), {}),
        ((_r(g, 7, 4, dtype=torch.bfloat16), _r(g, 7, 4, dtype=torch.bfloat16) * 0.2, _r(g, 7, 4, dtype=torch.bfloat16)), {}),
        ((_r(g, 6, 5), _r(g, 6, 5), _r(g, 6, 5), torch.tensor([3, 5], dtype=torch.int32)), {}),
    ]


def _rope_inputs(g: torch.Generator, B: int, L: int, rope: int, max_pos: int = 9) -> tuple[torch.Tensor, torch.Tensor]:
    """A (max_pos, rope/2, 2) cos/sin cache of real angles and (B, L) positions into it."""
    angles = torch.rand(max_pos, rope // 2, generator=g) * 6.3
    cache = torch.stack([angles.cos(), angles.sin()], dim=-1)
    return cache, torch.randint(0, max_pos, (B, L), generator=g)


def fused_mla_k_rope_samples() -> Samples:
    g = generator(63)
    out = []
    for B, L, H, nope, V, rope, dtype in ((3, 5, 4, 4, 6, 4, torch.float32), (2, 3, 3, 2, 2, 6, torch.bfloat16)):
        cache, pos = _rope_inputs(g, B, L, rope)
        out.append(((_r(g, B, L, H, nope + V, dtype=dtype), _r(g, B, L, rope, dtype=dtype), cache, pos, nope), {}))
    return out


def fused_mla_kv_backward_samples() -> Samples:
    g = generator(64)
    out = []
    for B, L, H, nope, V, rope, dtype in ((3, 5, 4, 4, 6, 4, torch.float32), (2, 3, 3, 2, 2, 6, torch.bfloat16)):
        cache, pos = _rope_inputs(g, B, L, rope)
        out.append(((_r(g, B, L, H, nope + rope, dtype=dtype), _r(g, B, L, H, V, dtype=dtype), cache, pos, nope, rope), {}))
    return out


def fused_mla_q_rope_samples() -> Samples:
    """q (B, L, H, nope + rope), rotated forward (fp32) and back (bf16, the backward's use)."""
    g = generator(65)
    out = []
    for B, L, H, nope, rope, dtype, inverse in ((3, 5, 4, 4, 4, torch.float32, False),
                                                (2, 3, 3, 2, 6, torch.bfloat16, True)):
        cache, pos = _rope_inputs(g, B, L, rope)
        out.append(((_r(g, B, L, H, nope + rope, dtype=dtype), cache, pos, nope, inverse), {}))
    return out


def _helion_samples(seed: int, cache_of: Callable[[torch.Tensor], torch.Tensor]) -> Samples:
    """(xq, xk, cache, positions): more q heads than k heads (GQA), fp32 and bf16, odd sizes."""
    g = generator(seed)
    out = []
    for B, L, H, Hk, D, dtype in ((3, 5, 4, 2, 8, torch.float32), (2, 3, 3, 1, 4, torch.bfloat16)):
        angles = torch.rand(9, D // 2, generator=g) * 6.3
        pos = torch.randint(0, 9, (B, L), generator=g)
        out.append(((_r(g, B, L, H, D, dtype=dtype), _r(g, B, L, Hk, D, dtype=dtype), cache_of(angles), pos), {}))
    return out


def helion_cossin_rope_samples() -> Samples:
    """The cossin cache: (M, 2D), cos then sin, each half repeated (rotate-half's layout)."""
    return _helion_samples(66, lambda a: torch.cat([a.cos(), a.cos(), a.sin(), a.sin()], dim=-1))


def helion_complex_rope_samples() -> Samples:
    """The complex cache: view_as_real of (M, D/2) unit complex numbers, (M, D/2, 2)."""
    return _helion_samples(67, lambda a: torch.stack([a.cos(), a.sin()], dim=-1))


def deterministic_scatter_add_strategy(op: Any, args: Any, kwargs: Any) -> list[Row]:
    """aten.scatter_add's rows at dim 0 (the op is ``out.scatter_add(0, index, src)``)."""
    out, index, src = args[:3]
    return scatter_add_strategy(torch.ops.aten.scatter_add.default, (out, 0, index, src), {})


def deterministic_scatter_add_cost(op: OpOverload, args: tuple, kwargs: dict) -> OpCost:
    """aten.scatter_add's cost at dim 0: reads out, index and the src rows, writes the result."""
    out, index, src = args[:3]
    return scatter_cost(torch.ops.aten.scatter_add.default, (out, 0, index, src), {})


def silu_and_mul_strategy(op: Any, args: Any, kwargs: Any) -> list[Row]:
    """Rows and columns shard pointwise (rows only without offsets); linear in ``up``."""
    gate, up = metas(args)[:2]
    offs: list[PlacementOrHole] = [R] if len(args) > 2 and args[2] is not None else []
    rows: list[Row] = [] if offs else [[Shard(0), Shard(0), Shard(0)]]
    if len(gate.shape) == 2:
        rows.append([Shard(1), Shard(1), Shard(1), *offs])
    for reduce_op in ("sum", "avg"):
        if reduce_op in partial_ops([gate.dtype, up.dtype]):
            P = Partial(reduce_op)
            rows.append([P, R, P, *offs])
    return rows


def silu_and_mul_backward_strategy(op: Any, args: Any, kwargs: Any) -> list[Row]:
    """Pointwise shards; both outputs linear in grad; grad_gate linear in up (grad_up then R)."""
    grad, gate, up = metas(args)[:3]
    offs: list[PlacementOrHole] = [R] if len(args) > 3 and args[3] is not None else []
    rows: list[Row] = [] if offs else [[Shard(0)] * 5]
    if len(gate.shape) == 2:
        rows.append([Shard(1)] * 5 + offs)
    for reduce_op in ("sum", "avg"):
        if reduce_op in partial_ops([grad.dtype, gate.dtype, up.dtype]):
            P = Partial(reduce_op)
            rows.append([P, P, P, R, R, *offs])
            # grad_up does not read up: it is the same on every rank, R or any mean/max/min of itself
            for same in (R, Partial("avg"), Partial("max"), Partial("min")):
                rows.append([P, same, R, R, P, *offs])
    return rows


def silu_and_mul_cost(op: OpOverload, args: tuple, kwargs: dict) -> OpCost:
    """Elementwise: ~5 flops per element (sigmoid as exp + add + div, two muls); reads gate and
    up, writes out (rows past ``offsets[-1]`` counted too: the limit is data, not shape)."""
    gate, up = args[:2]
    n = gate.numel()
    return OpCost(5 * n, gate.nbytes + up.nbytes, n * gate.element_size(), dtype=gate.dtype, family="pointwise")


def silu_and_mul_backward_cost(op: OpOverload, args: tuple, kwargs: dict) -> OpCost:
    """Elementwise: ~10 flops per element; reads grad, gate, up, writes grad_gate and grad_up."""
    grad, gate, up = args[:3]
    n = gate.numel()
    return OpCost(10 * n, grad.nbytes + gate.nbytes + up.nbytes, gate.nbytes + up.nbytes, dtype=gate.dtype,
                  family="pointwise")


def fused_mla_k_rope_strategy(op: Any, args: Any, kwargs: Any) -> list[Row]:
    """Tokens and heads shard; linear in (kv, k_pe) (see the table above)."""
    kv, k_pe = metas(args)[:2]
    rows: list[Row] = [[Shard(d), Shard(d), Shard(d), R, Shard(d)] for d in (0, 1)]
    rows.append([Shard(2), Shard(2), R, R, R])
    ops = partial_ops([kv.dtype, k_pe.dtype])
    if "sum" in ops:
        P = Partial("sum")
        rows.append([P, P, P, R, R])
    if "avg" in ops:
        A = Partial("avg")
        rows += [[A, a, b, R, R] for a, b in ((A, A), (A, R), (R, A))]
    return rows


def fused_mla_kv_backward_strategy(op: Any, args: Any, kwargs: Any) -> list[Row]:
    """Tokens shard; heads shard with grad_k_pe Partial(sum); linear in the gradients."""
    grad_k, grad_v = metas(args)[:2]
    rows: list[Row] = [[Shard(d), Shard(d), Shard(d), Shard(d), R, Shard(d)] for d in (0, 1)]
    ops = partial_ops([grad_k.dtype, grad_v.dtype])
    if "sum" in ops:
        P = Partial("sum")
        rows.append([Shard(2), P, Shard(2), Shard(2), R, R])
        rows.append([P, P, P, P, R, R])
    if "avg" in ops:
        A = Partial("avg")
        rows += [[A, A, A, A, R, R], [A, A, A, R, R, R]]
        rows += [[A, same, R, A, R, R] for same in (R, A, Partial("max"), Partial("min"))]
    return rows


def fused_mla_q_rope_strategy(op: Any, args: Any, kwargs: Any) -> list[Row]:
    """In place: the result is q, so each row repeats q's placement; tokens, heads, linear in q."""
    q = metas(args)[0]
    rows: list[Row] = [[Shard(d), Shard(d), R, Shard(d)] for d in (0, 1)]
    rows.append([Shard(2), Shard(2), R, R])
    rows += [[Partial(o), Partial(o), R, R] for o in ("sum", "avg") if o in partial_ops([q.dtype])]
    return rows


def fused_mla_q_rope_cost(op: OpOverload, args: tuple, kwargs: dict) -> OpCost:
    """Rotates the rope part of every head in place (6 flops a pair): reads and writes only that
    part of q, plus a cos/sin pair per rope pair and a position per token."""
    q = args[0]
    B, L, H = q.shape[:3]
    rope = q.shape[-1] - args[3]
    moved = B * L * H * rope * q.element_size()
    return OpCost(3 * B * L * H * rope, moved + B * L * (rope * 4 + 8), moved, dtype=torch.float32,
                  family="pointwise")


def helion_rope_strategy(op: Any, args: Any, kwargs: Any) -> list[Row]:
    """Tokens shard (both pairs with positions); otherwise (xq, xq_out) and (xk, xk_out) independent."""
    xq, xk = metas(args)[:2]
    rows: list[Row] = [[Shard(d)] * 4 + [R, Shard(d)] for d in (0, 1)]

    def choices(t: Any) -> list[Placement]:
        return [R, Shard(2), *(Partial(o) for o in ("sum", "avg") if o in partial_ops([t.dtype]))]

    rows += [[a, b, a, b, R, R] for a in choices(xq) for b in choices(xk) if not (a == R and b == R)]
    return rows


def helion_rope_cost(op: OpOverload, args: tuple, kwargs: dict) -> OpCost:
    """Rotates every element of xq and xk once (3 flops an element: a pair is 6), gathering a cache
    row per token; reads and writes xq and xk."""
    xq, xk, cache = args[:3]
    B, L = xq.shape[:2]
    row = cache.nbytes // max(cache.shape[0], 1)
    return OpCost(3 * (xq.numel() + xk.numel()), xq.nbytes + xk.nbytes + B * L * (row + 8),
                  xq.nbytes + xk.nbytes, dtype=torch.float32, family="pointwise")


def fused_mla_k_rope_cost(op: OpOverload, args: tuple, kwargs: dict) -> OpCost:
    """Copies kv's nope part, rotates k_pe once per token (6 flops a pair), writes k (every head)."""
    kv, k_pe = args[:2]
    B, L, H = kv.shape[:3]
    nope, rope = args[4], k_pe.shape[-1]
    out = B * L * H * (nope + rope) * kv.element_size()
    read = B * L * H * nope * kv.element_size() + k_pe.nbytes + B * L * (rope * 4 + 8)
    return OpCost(3 * B * L * rope, read, out, dtype=torch.float32, family="pointwise")


def fused_mla_kv_backward_cost(op: OpOverload, args: tuple, kwargs: dict) -> OpCost:
    """Copies grad_k's nope part and grad_v, sums grad_k's rope part over heads, rotates it back."""
    grad_k, grad_v = args[:2]
    B, L, H = grad_k.shape[:3]
    nope, rope = args[4], args[5]
    isz = grad_k.element_size()
    written = B * L * H * (nope + grad_v.shape[-1]) * isz + B * L * rope * isz
    read = grad_k.nbytes + grad_v.nbytes + B * L * (rope * 4 + 8)
    return OpCost(B * L * H * rope + 3 * B * L * rope, read, written, dtype=torch.float32, family="pointwise")


class _Spec:
    """One torchtitan op: its name, the module whose import defines it, and its whole contract."""

    def __init__(self, name: str, module: str, strategy: Callable, cost: Callable, samples: Callable[[], Samples]) -> None:
        self.name, self.module, self.strategy, self.cost, self.samples = name, module, strategy, cost, samples

    def op(self) -> OpOverload:
        return getattr(torch.ops.torchtitan, self.name).default

    def defined(self) -> bool:
        """Whether the op exists (helion_rope's are defined only where helion is installed)."""
        return hasattr(torch.ops.torchtitan, self.name)

    def register(self) -> OpOverload:
        """Register the rule (idempotent); the op must be defined."""
        from dtensor_rules import registry

        op = self.op()
        if op not in registry.rules():
            registry.register(op, cost=self.cost, samples=self.samples)(self.strategy)
        return op

    def define(self) -> OpOverload:
        """Import torchtitan's module (defines the op) and register the rule: what `validate --op` needs."""
        importlib.import_module(self.module)
        if not self.defined():
            raise RuntimeError(f"importing {self.module} did not define torchtitan::{self.name}: it is defined only "
                               "where helion is installed (pip install 'dtensor_rules[torchtitan]' installs it)")
        return self.register()


TORCHTITAN_OPS = (
    _Spec("deterministic_scatter_add", SCATTER_ADD, deterministic_scatter_add_strategy, deterministic_scatter_add_cost,
          deterministic_scatter_add_samples),
    _Spec("silu_and_mul", FUSED_SWIGLU, silu_and_mul_strategy, silu_and_mul_cost, silu_and_mul_samples),
    _Spec("silu_and_mul_backward", FUSED_SWIGLU, silu_and_mul_backward_strategy, silu_and_mul_backward_cost,
          silu_and_mul_backward_samples),
    _Spec("fused_mla_k_rope", FUSED_MLA, fused_mla_k_rope_strategy, fused_mla_k_rope_cost, fused_mla_k_rope_samples),
    _Spec("fused_mla_q_rope_", FUSED_MLA, fused_mla_q_rope_strategy, fused_mla_q_rope_cost,
          fused_mla_q_rope_samples),
    _Spec("fused_mla_kv_backward", FUSED_MLA, fused_mla_kv_backward_strategy, fused_mla_kv_backward_cost,
          fused_mla_kv_backward_samples),
    *(_Spec(f"helion_{kind}_rope_{d}", HELION_ROPE, helion_rope_strategy, helion_rope_cost, samples)
      for kind, samples in (("cossin", helion_cossin_rope_samples), ("complex", helion_complex_rope_samples))
      for d in ("fwd", "bwd")),
)

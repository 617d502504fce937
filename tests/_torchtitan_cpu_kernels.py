"""CPU stand-ins for torchtitan's CUDA-only kernels: what the rule proofs run them as on CPU.

``silu_and_mul`` (and backward) and the fused MLA rope ops are Triton kernels registered for CUDA
only; these are plain torch with each kernel's semantics (float32 math, cast to the input dtype;
silu_and_mul's rows past ``offsets[-1]`` are not computed: zero here, unwritten memory in the
kernel). The helion rope ops' stand-in is torchtitan's own helion kernel in helion's reference
(eager PyTorch) mode. ``tests/test_torchtitan_ops.py`` registers them as the ops' CPU kernels;
``tests/test_gpu_torchtitan_kernels.py`` checks them against the CUDA kernels on a GPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from tests._torchtitan import require_helion_rope

__all__ = ["rows_before", "silu_and_mul_cpu", "silu_and_mul_backward_cpu", "fused_mla_k_rope_cpu",
           "fused_mla_kv_backward_cpu", "fused_mla_q_rope_cpu", "helion_kernels", "helion_reference_mode",
           "helion_on_cpu"]


def rows_before(n: int, offsets: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    limit = n if offsets is None else int(offsets[-1])
    return (torch.arange(n, device=device) < limit).unsqueeze(-1)


def silu_and_mul_cpu(gate: torch.Tensor, up: torch.Tensor, offsets: torch.Tensor | None = None) -> torch.Tensor:
    out = (F.silu(gate.float()) * up.float()).to(gate.dtype)
    return torch.where(rows_before(gate.shape[0], offsets, gate.device), out, torch.zeros_like(out))


def silu_and_mul_backward_cpu(grad: torch.Tensor, gate: torch.Tensor, up: torch.Tensor,
                              offsets: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    g, x, u = grad.float(), gate.float(), up.float()
    s = torch.sigmoid(x)
    keep = rows_before(gate.shape[0], offsets, gate.device)
    grad_gate = torch.where(keep, g * u * s * (1 + x * (1 - s)), 0.0).to(gate.dtype)
    grad_up = torch.where(keep, g * x * s, 0.0).to(up.dtype)
    return grad_gate, grad_up


def _rotate(x: torch.Tensor, cache: torch.Tensor, positions: torch.Tensor, inverse: bool) -> torch.Tensor:
    """torchtitan's ComplexRoPE on adjacent pairs of the last dim, in float32 (the kernels' math)."""
    cs = cache[positions].float()  # (B, L, R/2, 2)
    cos, sin = cs[..., 0], cs[..., 1]
    while cos.ndim < x.ndim:  # broadcast over heads
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    even, odd = x.float()[..., 0::2], x.float()[..., 1::2]
    if inverse:
        out = torch.stack([even * cos + odd * sin, odd * cos - even * sin], dim=-1)
    else:
        out = torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1)
    return out.flatten(-2)


def fused_mla_k_rope_cpu(kv: torch.Tensor, k_pe: torch.Tensor, cache: torch.Tensor, positions: torch.Tensor,
                         q_nope_dim: int) -> torch.Tensor:
    rope = _rotate(k_pe, cache, positions, inverse=False).to(kv.dtype)
    heads = kv.shape[2]
    return torch.cat([kv[..., :q_nope_dim], rope.unsqueeze(2).expand(-1, -1, heads, -1)], dim=-1).contiguous()


def fused_mla_kv_backward_cpu(grad_k: torch.Tensor, grad_v: torch.Tensor, cache: torch.Tensor, positions: torch.Tensor,
                              q_nope_dim: int, rope_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    grad_kv = torch.cat([grad_k[..., :q_nope_dim], grad_v], dim=-1).contiguous()
    summed = grad_k[..., q_nope_dim:].float().sum(dim=2)
    if grad_k.dtype in (torch.bfloat16, torch.float16):  # the kernel keeps eager's rounding of the head sum
        summed = summed.to(grad_k.dtype).float()
    return grad_kv, _rotate(summed, cache, positions, inverse=True).to(grad_k.dtype)


def fused_mla_q_rope_cpu(q: torch.Tensor, cache: torch.Tensor, positions: torch.Tensor, q_nope_dim: int,
                         inverse: bool) -> torch.Tensor:
    """In place, like the kernel: the rope part of every head rotated (or back), the nope part untouched."""
    q[..., q_nope_dim:] = _rotate(q[..., q_nope_dim:], cache, positions, inverse).to(q.dtype)
    return q


def helion_kernels() -> dict[str, Any]:
    """torchtitan's four helion rope kernels by op name (a skip without helion, outside CI)."""
    hr = require_helion_rope()
    return {f"helion_{k}_rope_{d}": getattr(hr, f"_rope_{n}_{d}") for k, n in (("cossin", "cos_sin"),
                                                                             ("complex", "complex"))
            for d in ("fwd", "bwd")}


@contextlib.contextmanager
def helion_reference_mode(kernels: dict[str, Any]) -> Iterator[None]:
    """The kernels run in helion's reference (eager PyTorch) mode inside the block; their own mode again after it."""
    from helion.runtime.ref_mode import RefMode

    before = {name: k.settings.ref_mode for name, k in kernels.items()}
    for kernel in kernels.values():
        kernel.settings.ref_mode = RefMode.EAGER
    try:
        yield
    finally:
        for name, kernel in kernels.items():
            kernel.settings.ref_mode = before[name]


def helion_on_cpu(lib: torch.library.Library) -> Callable[[], None]:
    """Where helion is installed: the helion ops' CPU kernel is torchtitan's own helion kernel in
    helion's reference (eager PyTorch) mode, so the rules are checked against the real kernel code.
    Returns the function that restores the kernels' mode."""
    try:
        kernels = helion_kernels()
    except pytest.skip.Exception:
        return lambda: None
    mode = helion_reference_mode(kernels)
    mode.__enter__()
    for name, kernel in kernels.items():
        lib.impl(name, lambda *a, _k=kernel: _k(*(t.contiguous() for t in a)), "CPU")
    return lambda: mode.__exit__(None, None, None)

"""GPU lane: torchtitan's CUDA kernels against the CPU stand-ins the rule proofs run them as.

``tests/test_torchtitan_ops.py`` proves the DTensor rules of torchtitan's custom ops on CPU, where
the CUDA-only ops run as stand-ins (``tests/_torchtitan_cpu_kernels.py``: plain torch with each
kernel's semantics; helion's kernels in helion's reference mode). Those proofs hold for the real
kernels only if the stand-ins compute what the kernels compute: here every sample of every op's
suite (the rule proofs' own inputs) runs through torchtitan's CUDA kernel and through the stand-in
on CPU, and the results must agree within the rounding of the output dtype. Rows past
``offsets[-1]`` of ``silu_and_mul`` (and its backward) are not written by the kernel and not
compared. ``deterministic_scatter_add`` has no CUDA-only kernel: its CUDA result is compared with its
own CPU result.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from dtensor_rules.op_rules.torchtitan_ops import TORCHTITAN_OPS
from tests._gpu import GPU
from tests._torchtitan import require_torchtitan
from tests._torchtitan_cpu_kernels import (fused_mla_k_rope_cpu, fused_mla_kv_backward_cpu, fused_mla_q_rope_cpu,
                                           helion_kernels, helion_reference_mode, silu_and_mul_backward_cpu,
                                           silu_and_mul_cpu)

pytestmark = GPU

CUDA = torch.device("cuda")
STAND_INS: dict[str, Callable[..., Any]] = {
    "silu_and_mul": silu_and_mul_cpu,
    "silu_and_mul_backward": silu_and_mul_backward_cpu,
    "fused_mla_k_rope": fused_mla_k_rope_cpu,
    "fused_mla_kv_backward": fused_mla_kv_backward_cpu,
    "fused_mla_q_rope_": fused_mla_q_rope_cpu,
}
MODULES = {"deterministic_scatter_add": "torchtitan.ops.scatter_add",
           "silu_and_mul": "torchtitan.overrides.fused_swiglu",
           "silu_and_mul_backward": "torchtitan.overrides.fused_swiglu",
           **{n: "torchtitan.overrides.fused_mla" for n in ("fused_mla_k_rope", "fused_mla_kv_backward",
                                                              "fused_mla_q_rope_")}}
SILU_OFFSETS_ARG = {"silu_and_mul": 2, "silu_and_mul_backward": 3}  # where the optional offsets sit
HELION = tuple(f"helion_{kind}_rope_{d}" for kind in ("cossin", "complex") for d in ("fwd", "bwd"))


def _samples(name: str) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """The op's own sample suite: the inputs its rule is proved on."""
    (spec,) = (s for s in TORCHTITAN_OPS if s.name == name)
    return list(spec.samples())


def _to(args: tuple[Any, ...], device: torch.device) -> tuple[Any, ...]:
    return tuple(a.to(device).clone() if isinstance(a, torch.Tensor) else a for a in args)


def _outputs(result: Any) -> list[torch.Tensor]:
    return [t.cpu() for t in (result if isinstance(result, (tuple, list)) else (result,))]


def _mismatches(name: str, got: list[torch.Tensor], want: list[torch.Tensor], args: tuple[Any, ...]) -> list[str]:
    """Each output within the rounding of its dtype: fp32 1e-5, bf16/fp16 two ulps, of the largest value."""
    out = []
    at = SILU_OFFSETS_ARG.get(name, len(args))
    offsets = args[at] if len(args) > at else None
    for i, (g, w) in enumerate(zip(got, want)):
        if g.shape != w.shape or g.dtype != w.dtype:
            out.append(f"{name} output {i}: {tuple(g.shape)} {g.dtype} vs {tuple(w.shape)} {w.dtype}")
            continue
        if offsets is not None:  # rows past offsets[-1] are not written by the kernel
            g, w = g[: int(offsets[-1])], w[: int(offsets[-1])]
        rel = 1e-5 if w.dtype == torch.float32 else 2 * torch.finfo(w.dtype).eps
        err = (g.float() - w.float()).abs().max().item() if w.numel() else 0.0
        if not err <= rel * (1 + w.float().abs().max().item()):
            out.append(f"{name} output {i} ({w.dtype}): max error {err:.3g}")
    return out


@pytest.mark.parametrize("name", [*MODULES, *HELION])
def test_cuda_kernel_equals_the_cpu_stand_in(name: str) -> None:
    if name in HELION:
        kernels = helion_kernels()  # a skip without helion, outside CI
        require_torchtitan("torchtitan.overrides.helion_rope")
    else:
        require_torchtitan(MODULES[name])
    op = getattr(torch.ops.torchtitan, name).default
    problems = []
    for args, kwargs in _samples(name):
        got = _outputs(op(*_to(args, CUDA), **kwargs))
        if name in HELION:  # the kernel itself in helion's reference mode, on CPU (after every CUDA call)
            with helion_reference_mode(kernels):
                want = _outputs(kernels[name](*(a.contiguous() for a in _to(args, torch.device("cpu")))))
        elif name in STAND_INS:
            want = _outputs(STAND_INS[name](*_to(args, torch.device("cpu")), **kwargs))
        else:
            want = _outputs(op(*_to(args, torch.device("cpu")), **kwargs))
        problems += _mismatches(name, got, want, args)
    assert not problems, "\n".join(problems)

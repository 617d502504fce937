"""Trace a module's joint forward+backward into one aten graph on fake tensors.

Why: a solver chooses one placement per *operation* of a training step, so it needs the
backward ops as graph nodes (their layouts cost communication too), not only the forward.
``make_fx(tracing_mode="fake")`` over ``autograd.grad`` gives exactly that graph, with each
node's fake output (``node.meta["val"]``) for shapes and dtypes; no data and no rank run.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import fx, nn
from torch.fx.experimental.proxy_tensor import make_fx

__all__ = ["JointGraph", "trace_joint"]


class JointGraph(NamedTuple):
    """The traced step: ``graph``'s placeholders are ``params`` (names, in order), then the
    ``buffers``, then the input, then the output's tangent; its outputs are ``(out, *grads)``."""

    graph: fx.GraphModule
    params: tuple[str, ...]
    buffers: tuple[str, ...]


def trace_joint(module: nn.Module, x: torch.Tensor) -> JointGraph:
    """The joint forward+backward of ``module(x)`` as an aten graph (fake tensors, no data)."""
    params = {n: p for n, p in module.named_parameters()}
    buffers = {n: b for n, b in module.named_buffers()}
    pnames, bnames = tuple(params), tuple(buffers)

    def joint(*flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ps = flat[: len(pnames)]
        bs = flat[len(pnames): len(pnames) + len(bnames)]
        inp, tangent = flat[-2:]
        state = {**dict(zip(pnames, ps)), **dict(zip(bnames, bs))}
        out = torch.func.functional_call(module, state, (inp,))
        grads = torch.autograd.grad(out, ps, tangent)
        return (out, *grads)

    leaves = [p.detach().requires_grad_(True) for p in params.values()]
    leaves += [b.detach() for b in buffers.values()]
    leaves += [x.detach(), torch.empty_like(x)]
    gm = make_fx(joint, tracing_mode="fake")(*leaves)
    gm.graph.eliminate_dead_code()
    return JointGraph(gm, pnames, bnames)

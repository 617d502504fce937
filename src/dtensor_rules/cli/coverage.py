"""Which ops of a model's forward+backward have a DTensor sharding rule, and from where.

:func:`coverage` traces ``loss -> grads`` of a module (or function) with ``make_fx``
(``torch.autograd.grad`` of the outputs wrt every parameter and floating input, with
the cotangents as graph inputs, so the graph is the joint forward+backward a trainer
runs), and reports for every op in the graph:

- ``rule``: where DTensor's dispatch gets its sharding decision from:
  ``ours`` (a rule in :func:`dtensor_rules.registry.rules`), ``upstream`` (a rule in the
  propagator's ``op_single_dim_strategy_funcs`` / ``op_strategy_funcs`` / ``op_to_rules``),
  ``decomp`` (no rule, but DTensor propagates through the op's decomposition:
  ``DecompShardingStrategy.has_decomp``), ``handler`` (DTensor's dispatcher handles the op
  itself, e.g. ``aten.convolution``) or ``none`` (DTensor fails on it);
- ``strategies``: how many distinct (input placements, output placements) combos the
  active rule offers on the mesh for the traced shapes (min-max over the op's calls; ``-``
  where it cannot be asked: decomp, handler, propagation rules; ``-*`` where the rule
  answered in a form not counted as combos, with a note under the table saying why, e.g. a
  ``TupleStrategy``; ``err`` if asking failed, see ``CoverageRow.error``). Single-dim rules
  are expanded to the mesh as dispatch does (placeholders as plain ``Shard``); op-strategy
  rules are asked with every candidate input layout (R, S(d) on dims of size > 1, P(sum)
  for floats), so a rule that follows its input counts each layout it accepts; a strategy
  that states no input specs counts as dispatch runs it, every input laid out like its output;
- ``cost``: estimated runtime of all the op's calls on a hardware profile (default
  ``h100``): ``dtensor_rules.costs.runtime(estimate(...))`` summed over the calls, priced
  on meta tensors of the traced shapes, with the summed flops and bytes; ``~`` marks an
  estimate that assumed data-dependent values (e.g. balanced ``_grouped_mm`` groups),
  ``err: ...`` an op the cost model cannot price.

Excluded from the table (DTensor never asks the propagator about them):

- graph plumbing: placeholders, outputs, ``get_attr`` nodes;
- non-op callables: ``operator.getitem`` on multi-output ops and Python/SymInt
  arithmetic (``operator.*``, ``torch.sym_*``);
- shape queries ``aten.sym_size/sym_stride/sym_numel/sym_storage_offset`` (DTensor answers
  them from its spec) and ``aten._local_scalar_dense`` (``.item()``: the propagator
  returns early for it).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._ops import OpOverload
from torch.utils import _pytree as pytree

__all__ = ["CoverageReport", "CoverageRow", "coverage", "coverage_main", "EXCLUDED_OPS"]

aten = torch.ops.aten
EXCLUDED_OPS = frozenset(
    {
        aten.sym_size.int,
        aten.sym_stride.int,
        aten.sym_numel.default,
        aten.sym_storage_offset.default,
        aten._local_scalar_dense.default,
    }
)


@dataclass
class CoverageRow:
    """One op of the traced graph."""

    op: OpOverload
    calls: int
    rule: str  # ours | upstream | decomp | handler | none
    strategies: str  # "12", "4-9", "-" or "err"
    cost: str
    error: str = ""
    note: str = ""  # why ``strategies`` is "-*": the rule answered, in a form that is not counted

    @property
    def name(self) -> str:
        return str(self.op)


@dataclass
class CoverageReport:
    """Per-op coverage of a traced forward+backward; ``table()`` renders it."""

    mesh_shape: tuple[int, ...]
    rows: list[CoverageRow] = field(default_factory=list)

    @property
    def missing(self) -> list[OpOverload]:
        """Ops DTensor has no way to shard (no rule, no decomposition, no handler)."""
        return [r.op for r in self.rows if r.rule == "none"]

    def table(self) -> str:
        header = ("op", "calls", "rule", "strategies", "cost")
        body = [(r.name, str(r.calls), r.rule, r.strategies, r.cost) for r in self.rows]
        widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]
        fmt = lambda row: "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip()  # noqa: E731
        lines = [fmt(header), fmt(tuple("-" * w for w in widths)), *map(fmt, body)]
        counts = {k: sum(r.rule == k for r in self.rows) for k in ("ours", "upstream", "decomp", "handler", "none")}
        mesh = "x".join(map(str, self.mesh_shape))
        lines.append(f"{len(self.rows)} ops on mesh {mesh}: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
        lines += [f"-* {r.name}: {r.note}" for r in self.rows if r.note]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


# --------------------------------------------------------------------------- tracing
def _joint_fn(
    module_or_fn: Callable[..., Any], n_inputs: int
) -> tuple[Callable[..., Any], list[torch.Tensor], list[torch.Tensor]]:
    """A function of (params..., buffers..., inputs..., cotangents...) returning (outputs, grads)."""
    if isinstance(module_or_fn, torch.nn.Module):
        named = dict(module_or_fn.named_parameters())
        named_buffers = dict(module_or_fn.named_buffers())
        names = [*named, *named_buffers]
        params, buffers = list(named.values()), list(named_buffers.values())

        def call(state: Sequence[torch.Tensor], xs: Sequence[torch.Tensor]) -> Any:
            return torch.func.functional_call(module_or_fn, dict(zip(names, state)), tuple(xs))
    else:
        params, buffers = [], []

        def call(state: Sequence[torch.Tensor], xs: Sequence[torch.Tensor]) -> Any:
            return module_or_fn(*xs)

    n_state = len(params) + len(buffers)

    def joint(*flat: torch.Tensor) -> Any:
        state, xs = flat[:n_state], flat[n_state : n_state + n_inputs]
        cots = flat[n_state + n_inputs :]
        outs = [o for o in pytree.tree_leaves(call(state, xs)) if isinstance(o, torch.Tensor) and o.requires_grad]
        wrt = [t for t in (*state, *xs) if isinstance(t, torch.Tensor) and t.requires_grad]
        grads = torch.autograd.grad(outs, wrt, cots[: len(outs)], allow_unused=True)
        return outs, [g for g in grads if g is not None]

    return joint, params, buffers


def trace_joint(module_or_fn: Callable[..., Any], example_inputs: Sequence[Any]) -> torch.fx.GraphModule:
    """make_fx graph of forward + ``autograd.grad`` wrt params and floating inputs.

    Traced with fake tensors; falls back to real tensors if an op's fake (meta) kernel
    rejects the inputs (e.g. ``_grouped_mm``'s meta accepts only bf16 in torch 2.13).
    """
    from torch.fx.experimental.proxy_tensor import make_fx

    inputs = [
        x.detach().requires_grad_(x.is_floating_point()) if isinstance(x, torch.Tensor) else x for x in example_inputs
    ]
    joint, params, buffers = _joint_fn(module_or_fn, len(inputs))
    outs = pytree.tree_leaves(module_or_fn(*inputs))
    cots = [torch.ones_like(o) for o in outs if isinstance(o, torch.Tensor) and o.requires_grad]
    params = [p.detach().requires_grad_(p.requires_grad) for p in params]
    flat = [*params, *buffers, *inputs, *cots]
    try:
        return make_fx(joint, tracing_mode="fake")(*flat)
    except RuntimeError:
        return make_fx(joint, tracing_mode="real")(*flat)


# --------------------------------------------------------------------------- classification
def _custom_handlers() -> dict[OpOverload, Any]:
    from dtensor_rules._upstream import custom_op_handlers

    return dict(custom_op_handlers())


def rule_source(op: OpOverload) -> str:
    """ours | upstream | decomp | handler | none: where DTensor's dispatch gets the decision now."""
    from dtensor_rules._upstream import DecompShardingStrategy

    from dtensor_rules import registry
    from dtensor_rules.testing.query import active_strategy

    if op in registry.active_ops():
        return "ours"
    if op in _custom_handlers():
        return "handler"
    if active_strategy(op) is not None:
        return "upstream"
    if DecompShardingStrategy.has_decomp(op):
        return "decomp"
    return "none"


def _materialize(x: Any, device: str) -> Any:
    """A node's meta value as a tensor of the same shape/stride/dtype: zeros on ``cpu``
    (strategy queries may look at values), no storage on ``meta`` (cost pricing)."""
    if isinstance(x, torch.Tensor):
        size = [int(s) for s in x.shape]
        stride = [int(s) for s in x.stride()]
        out = torch.empty_strided(size, stride, dtype=x.dtype, device=device)
        return out.zero_() if device != "meta" and out.numel() else out
    if isinstance(x, torch.SymInt):
        return int(x)
    return x


def _node_args(node: torch.fx.Node, device: str = "cpu") -> tuple[tuple[Any, ...], dict[str, Any]]:
    def val(a: Any) -> Any:
        return _materialize(a.meta.get("val") if isinstance(a, torch.fx.Node) else a, device)

    return pytree.tree_map(val, (tuple(node.args), dict(node.kwargs)))


def _count_strategies(op: OpOverload, args: Any, kwargs: Any, mesh: Any) -> int | str | None:
    """Distinct (input, output) placement combos the active rule offers, expanded as dispatch does
    (a strategy that states no input specs: inputs laid out like its output); None where the rule
    cannot be asked, a string saying why where its answer cannot be counted."""
    from dtensor_rules._upstream import TupleStrategy
    from dtensor_rules.testing.query import _input_strategies, _strategy_schema, active_strategy, emitted_combos
    from dtensor_rules.testing.simulate import Sample

    active = active_strategy(op)
    if active is None or active[0] not in ("single_dim", "op_strategy"):
        return None
    sample = Sample(args, kwargs)
    n = len(emitted_combos(active[0], active[1], op, sample, mesh, inputs_follow_output=True))
    if n == 0 and active[0] == "op_strategy":
        schema = _strategy_schema(op, sample, _input_strategies(mesh, sample.tensors(), all_candidates=False))
        if isinstance(active[1](schema), TupleStrategy):
            return "a TupleStrategy (one strategy per element of a list argument): not counted as combos"
        return "the rule offers no strategy for these shapes"
    return n


def _si(n: float) -> str:
    """3 significant digits with a k/M/G/T/P suffix: 1536 -> '1.54k'."""
    for suffix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{suffix}"
    return f"{n:.3g}"


def op_cost(op: OpOverload, nodes: Sequence[torch.fx.Node], hardware: Any) -> str:
    """Estimated runtime of all ``nodes`` (calls of ``op``) on ``hardware``, with their flops and bytes.

    Each call is priced on meta tensors of its traced shapes, so data-dependent costs use the
    cost model's documented assumptions; a leading ``~`` marks such an inexact estimate.
    ``err: <Exception>`` when the cost model cannot price the op (see ``CostError``).
    """
    from dtensor_rules.costs import estimate_call, runtime

    seconds, flops, nbytes, exact = 0.0, 0, 0, True
    try:
        for node in nodes:
            args, kwargs = _node_args(node, "meta")
            cost = estimate_call(op, args, kwargs)
            seconds += runtime(cost, hardware)
            flops, nbytes, exact = flops + cost.flops, nbytes + cost.bytes, exact and cost.exact
    except Exception as e:  # an op the cost model does not know: say so, do not hide the table
        return f"err: {type(e).__name__}"
    return f"{'' if exact else '~'}{_seconds(seconds)} ({_si(flops)} flop, {_si(nbytes)} B)"


def _seconds(s: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s * 1e6:.3g} us"


def _is_op_node(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and isinstance(node.target, OpOverload) and node.target not in EXCLUDED_OPS


def coverage(
    module_or_fn: Callable[..., Any],
    example_inputs: Sequence[Any],
    mesh_shape: Sequence[int] = (2, 2),
    hardware: Any = "h100",
) -> CoverageReport:
    """Trace forward+backward of ``module_or_fn(*example_inputs)`` and report each op's rule.

    ``module_or_fn`` is an ``nn.Module`` (gradients wrt its parameters and floating
    inputs) or a function (gradients wrt its floating inputs). ``hardware`` is the cost
    model profile (name or :class:`dtensor_rules.costs.Hardware`) the cost column is priced on.
    """
    from torch.distributed.device_mesh import init_device_mesh

    from dtensor_rules.testing.mesh import fake_world

    mesh_shape = tuple(mesh_shape)
    graph = trace_joint(module_or_fn, example_inputs)
    calls: dict[OpOverload, list[torch.fx.Node]] = {}
    for node in graph.graph.nodes:
        if _is_op_node(node):
            calls.setdefault(node.target, []).append(node)

    report = CoverageReport(mesh_shape)
    with fake_world(math.prod(mesh_shape)):
        mesh = init_device_mesh("cpu", mesh_shape)
        for op in sorted(calls, key=str):
            nodes = calls[op]
            source = rule_source(op)
            counts: list[int] = []
            error = note = ""
            for node in nodes:
                try:
                    n = _count_strategies(op, *_node_args(node), mesh)
                except Exception as e:  # report, do not abort: the table is a diagnostic
                    error = f"{type(e).__name__}: {e}".splitlines()[0][:300]
                    break
                if isinstance(n, str):
                    note = n
                elif n is not None:
                    counts.append(n)
            if error:
                strategies = "err"
            elif note:
                strategies = "-*"
            elif not counts:
                strategies = "-"
            else:
                lo, hi = min(counts), max(counts)
                strategies = str(lo) if lo == hi else f"{lo}-{hi}"
            cost = op_cost(op, nodes, hardware)
            report.rows.append(CoverageRow(op, len(nodes), source, strategies, cost, error, note))
    return report


# --------------------------------------------------------------------------- CLI
def _parse_mesh(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(s) for s in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--mesh {text!r}: expected sizes joined by 'x', e.g. 2x2") from None
    if not shape or any(s < 1 for s in shape):
        raise argparse.ArgumentTypeError(f"--mesh {text!r}: sizes must be positive")
    return shape


def moe_example() -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    """The MoE block the CLI traces: the demo's own (``demo_model.DEMO_CONFIG``, ``permute_impl="kernel"``,
    the demo's tokens), in bf16 (``_grouped_mm``'s CPU meta kernel needs it), so ``coverage`` and
    ``demo`` section 2 report on the same model."""
    from dtensor_rules.cli.demo_model import demo_inputs, demo_model

    return demo_model(torch.bfloat16, permute_impl="kernel"), (demo_inputs(torch.bfloat16)[0],)


def describe_moe_example() -> str:
    """One line naming the traced model, printed by both ``coverage`` and the demo."""
    from dtensor_rules.cli.demo_model import DEMO_CONFIG, TOKENS

    c = DEMO_CONFIG
    return (f"traced: the demo's MoE block (dim {c.dim}, hidden {c.hidden}, {c.n_experts} experts top-{c.top_k}, "
            f"{c.n_shared} shared, permute_impl='kernel'), bf16, tokens {'x'.join(map(str, TOKENS))}, forward+backward")


def coverage_main(
    argv: Sequence[str] | None = None,
    example: Callable[[], tuple[Callable[..., Any], Sequence[Any]]] = moe_example,
) -> int:
    """``python -m dtensor_rules coverage [--mesh 2x2]``: print the MoE block's table; 1 if an op has no rule."""
    parser = argparse.ArgumentParser(prog="python -m dtensor_rules coverage", description=coverage_main.__doc__)
    parser.add_argument("--mesh", type=_parse_mesh, default=(2, 2), help="mesh shape, e.g. 2x2 or 4")
    parser.add_argument("--hardware", default="h100", help="cost model profile for the cost column (h100, h200, a100, b200, cpu)")
    args = parser.parse_args(argv)
    model, inputs = example()
    report = coverage(model, inputs, mesh_shape=args.mesh, hardware=args.hardware)
    if example is moe_example:
        print(describe_moe_example())
    print(report.table())
    for row in report.rows:
        if row.error:
            print(f"{row.name}: strategy query failed: {row.error}")
    if report.missing:
        print("no sharding rule: " + ", ".join(map(str, report.missing)))
        return 1
    return 0

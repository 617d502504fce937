"""The rule registry: our rules as values, and the switch that puts them into DTensor.

A :class:`Rule` is one op's whole contract, as validated data: its strategy function, its cost
formula, its sample suite and its doc. :func:`register` collects rules (it imports no op
module: ``import dtensor_rules`` loads :mod:`dtensor_rules.op_rules`, whose modules register
themselves); :func:`install` patches DTensor's
``ShardingPropagator`` with them and :func:`uninstall` puts every touched registry
entry back exactly as it was (same keys, same function objects). Every other global change
is a named patch (:mod:`dtensor_rules.patches`, docs/patches.md): :func:`install` applies the
ones correctness needs or exactly ``patches=[...]``, :func:`status` lists them (``.patches``).
Which rule wins where upstream has one too is decided in one place (``_why_ours_wins``), for
:func:`install` and ``register(..., replace=True)`` alike.

Two kinds of strategy function are supported, mirroring upstream:

``kind="single_dim"``
    ``fn(op, args_meta, kwargs_meta) -> list[list[Placement | ShardingPlaceholder]]``,
    each inner list ``[*output_placements, *input_placements]`` for ONE mesh dim; the
    all-Replicate strategy is implied. Installed as an ``op_strategy`` through
    :mod:`dtensor_rules.dispatch`: dispatch prices at most two products of rows, other queries
    get upstream's expansion of every row over every mesh dim (docs/dispatch.md).
``kind="op_strategy"``
    ``fn(op_schema) -> OpStrategy | TupleStrategy`` for rules that need the mesh.

A rule may also carry a ``handler``: a DTensor custom-dispatch function
``handler(op, args, kwargs)`` installed into ``DTensor._op_dispatcher._custom_op_handlers``
(upstream's extension point for ops that cannot go through normal sharding propagation,
e.g. data-dependent output shapes) and removed exactly like the strategy entries.

And a ``meta_fallback``: ``fn(op_schema, error) -> TensorMeta`` used when DTensor's fake-tensor
output-metadata step raises for the op (e.g. ``_grouped_mm``'s meta kernel accepts only bf16
while the CPU kernel takes fp32/fp16). The named patch ``meta_fallback``
(:mod:`dtensor_rules.dispatch.meta_fallback`, on by default) wraps the propagator's
``_propagate_tensor_meta_non_cached``; installing a rule adds its fallback to that patch's table,
uninstalling removes it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Any, Literal, NamedTuple

import torch
from torch._ops import OpOverload
from torch.distributed.tensor.placement_types import Partial, Placement, Replicate, Shard
from torch.utils._pytree import tree_leaves

from dtensor_rules._upstream import (
    HANDLERS,
    SCHEMA_REGISTRIES,
    STRATEGY_REGISTRIES,
    OpSchema,
    OpStrategy,
    RuntimeSchemaInfo,
    ShardingPlaceholder,
    TensorMeta,
    TupleStrategy,
    clear_sharding_caches,
    measured_verdict,
    num_tensor_inputs,
    propagator,
    registry,
)
from dtensor_rules import patches as _patch_registry
from dtensor_rules.dispatch.meta_fallback import set_fallbacks
from dtensor_rules.dispatch.single_dim import SingleDimStrategy, n_outputs
from dtensor_rules.costs.op_cost import Formula
from dtensor_rules.costs.rule_source import use_rules
from dtensor_rules.costs.user_formula import from_flops_bytes

__all__ = [
    "Rule",
    "RuleError",
    "register",
    "register_rule",
    "install",
    "uninstall",
    "installed",
    "rules",
    "status",
    "Status",
    "get_rule",
    "is_shipped",
    "defer",
    "deferred",
    "DeferredRule",
]

Kind = Literal["single_dim", "op_strategy"]
Policy = Literal["measured", "override", "fill"]
_KINDS = ("single_dim", "op_strategy")
_POLICIES = ("measured", "override", "fill")


class RuleError(ValueError):
    """A rule, its registration or its output is malformed."""


SampleSuite = Callable[[], Sequence[tuple[tuple[Any, ...], dict[str, Any]]]]
"""``samples() -> [(args, kwargs), ...]``: fixed inputs (global tensors) the op is validated on."""


@dataclass(frozen=True)
class Rule:
    """One op's contract: everything the package knows about the op, in one validated value.

    ``strategy`` (with ``kind``) is the sharding rule; ``cost`` prices one call
    (``cost(op, args, kwargs) -> OpCost``, used by ``costs.estimate``); ``samples`` returns the
    inputs ``validate`` and the coverage benchmark check it on; ``doc`` is the strategy's
    docstring (its table of strategies). ``gaps`` says why ``cost`` or ``samples`` is None
    (every shipped rule has both or says why). ``schema_info``, ``allow_uneven_sharding``,
    ``handler`` and ``meta_fallback`` are DTensor extension points (module docstring).
    Wrong field types raise :class:`RuleError` naming the field.
    """

    op: OpOverload
    strategy: Callable[..., Any]
    kind: Kind = "single_dim"
    cost: Formula | None = None
    samples: SampleSuite | None = None
    doc: str = ""
    module: str = ""
    gaps: str = ""
    schema_info: RuntimeSchemaInfo | None = None
    allow_uneven_sharding: bool = True
    handler: Callable[..., Any] | None = None
    meta_fallback: Callable[..., Any] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.op, OpOverload):
            raise RuleError(f"Rule.op must be a torch OpOverload, got {self.op!r}")
        if not callable(self.strategy):
            raise RuleError(f"a rule must be callable, got {self.strategy!r}")
        _check_fields({f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("op", "strategy")})


def _check_fields(values: dict[str, Any]) -> None:
    """Raise RuleError naming the first field of ``values`` whose value has the wrong type."""
    for name, value in values.items():
        if name == "kind" and value not in _KINDS:
            raise RuleError(f"unknown rule kind {value!r}: use one of {_KINDS}")
        if name in _CALLABLE_FIELDS and value is not None and not callable(value):
            raise RuleError(f"{name}= must be callable{_CALLABLE_FIELDS[name]}, got {value!r}")
        if name in ("doc", "module", "gaps") and not isinstance(value, str):
            raise RuleError(f"{name}= must be a str, got {value!r}")
        if name == "allow_uneven_sharding" and not isinstance(value, bool):
            raise RuleError(f"allow_uneven_sharding= must be a bool, got {value!r}")
        if name == "schema_info" and value is not None and not isinstance(value, RuntimeSchemaInfo):
            raise RuleError(f"schema_info= must be a RuntimeSchemaInfo or None, got {value!r}")


_CALLABLE_FIELDS = {
    "cost": " (cost(op, args, kwargs) -> OpCost, e.g. dtensor_rules.op_rules.scan.cumsum_cost)",
    "samples": " (samples() -> [(args, kwargs), ...], e.g. dtensor_rules.op_rules.scan.cumsum_samples)",
    "flops": " (flops(*args, **kwargs) -> int)",
    "bytes": " (bytes(*args, **kwargs) -> int or (read, written))",
    "handler": "",
    "meta_fallback": "",
}


_lock = threading.RLock()
_rules: dict[OpOverload, Rule] = {}
use_rules(MappingProxyType(_rules))  # costs reads rules' formulas through this live view (no import back)
# op -> {registry attribute name -> (was_present, old_value)}; only ops we touched.
_saved: dict[OpOverload, dict[str, tuple[bool, Any]]] = {}
# op -> why ours is active (for status()) and the policy that installed it; set when installed
_why_ours: dict[OpOverload, str] = {}
_policy_of: dict[OpOverload, Policy] = {}


_STRATEGY_REGISTRIES = STRATEGY_REGISTRIES
_ALL_REGISTRIES = STRATEGY_REGISTRIES + SCHEMA_REGISTRIES
_HANDLERS = HANDLERS
_registry = registry
_propagator = propagator


def _as_overload(op: Any) -> OpOverload:
    """Accept an OpOverload or a ``torch.library.custom_op`` object; reject everything else."""
    if isinstance(op, OpOverload):
        return op
    inner = getattr(op, "_opoverload", None)  # torch.library.CustomOpDef
    if isinstance(inner, OpOverload):
        return inner
    if isinstance(op, torch._ops.OpOverloadPacket):
        raise RuleError(
            f"{op} is an overload packet, not an op overload: register each overload, "
            f"e.g. {op}.default ({', '.join(op.overloads())} exist)"
        )
    raise RuleError(
        f"cannot register a rule for {op!r}: expected a torch OpOverload such as "
        "torch.ops.aten.cumsum.default or a torch.library.custom_op"
    )


def default_schema_info(op: OpOverload) -> RuntimeSchemaInfo:
    """Cache key info that hashes every non-tensor argument.

    DTensor caches sharding decisions keyed on tensor specs plus the args named by
    ``RuntimeSchemaInfo``. Upstream registers many rules without one, so a ``dim``
    argument can be left out of the key; we always include every non-tensor arg.
    """
    args = op._schema.arguments
    positional = [a for a in args if not a.kwarg_only]
    static_argnum = len(positional)
    for i, a in enumerate(positional):
        if not _is_tensor_type(a.type):
            static_argnum = i
            break
    kwargkeys = [a.name for a in args if a.kwarg_only and not _is_tensor_type(a.type)]
    needs_pytree = any(isinstance(a.type, torch.ListType) for a in args if _is_tensor_type(a.type))
    return RuntimeSchemaInfo(
        static_argnum=static_argnum,
        static_kwargkey=kwargkeys or None,
        needs_pytree=needs_pytree,
    )


def _is_tensor_type(t: Any) -> bool:
    if isinstance(t, torch.OptionalType):
        t = t.getElementType()
    if isinstance(t, torch.ListType):
        t = t.getElementType()
        if isinstance(t, torch.OptionalType):
            t = t.getElementType()
    return isinstance(t, torch.TensorType)


def register(
    op: Any,
    *,
    cost: Formula | None = None,
    samples: SampleSuite | None = None,
    gaps: str = "",
    flops: Callable[..., int] | None = None,
    bytes: Callable[..., Any] | None = None,  # noqa: A002 - public name from the spec
    kind: Kind = "single_dim",
    schema_info: RuntimeSchemaInfo | None = None,
    replace: bool = False,
    allow_uneven_sharding: bool = True,
    handler: Callable[..., Any] | None = None,
    meta_fallback: Callable[..., Any] | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: register ``fn`` as the sharding rule of ``op`` (or of each op in a list).

    The call states the op's whole contract (:class:`Rule`): ``cost``, ``samples``, ``gaps``.
    ``flops=``/``bytes=`` are the short form of ``cost`` for simple custom ops, turned into one
    formula here (:func:`dtensor_rules.costs.user_formula.from_flops_bytes`).
    ``handler``, ``meta_fallback``: optional DTensor extension points (see module docstring).

    Raises :class:`RuleError` naming the field for a malformed argument, and if the op
    already has a rule here, unless ``replace=True``. Registration does not touch DTensor;
    :func:`install` does.
    """
    ops = [_as_overload(o) for o in (op if isinstance(op, (list, tuple)) else [op])]
    _check_fields(dict(
        kind=kind, cost=cost, samples=samples, gaps=gaps, flops=flops, bytes=bytes, schema_info=schema_info,
        allow_uneven_sharding=allow_uneven_sharding, handler=handler, meta_fallback=meta_fallback,
    ))
    if cost is not None and (flops is not None or bytes is not None):
        raise RuleError("give cost= (a formula returning OpCost) or flops=/bytes=, not both")
    if flops is not None or bytes is not None:
        cost = from_flops_bytes(flops, bytes)

    def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
        if not callable(fn):
            raise RuleError(f"a rule must be callable, got {fn!r}")
        new = [
            Rule(
                op=o,
                strategy=fn,
                kind=kind,
                cost=cost,
                samples=samples,
                doc=(fn.__doc__ or "").strip(),
                module=getattr(fn, "__module__", "") or "",
                gaps=gaps,
                schema_info=schema_info or default_schema_info(o),
                allow_uneven_sharding=allow_uneven_sharding,
                handler=handler,
                meta_fallback=meta_fallback,
            )
            for o in ops
        ]
        _add(new, replace)
        return fn

    return decorator


def register_rule(rule: Rule, *, replace: bool = False) -> Rule:
    """Register a :class:`Rule` value as it is (e.g. put back one read with :func:`get_rule`)."""
    if not isinstance(rule, Rule):
        raise RuleError(f"register_rule takes a Rule, got {rule!r}")
    _add([rule], replace)
    return rule


def _add(new: Sequence[Rule], replace: bool) -> None:
    """Store ``new`` (all or none), swapping an installed rule in place."""
    with _lock:
        for r in new:
            if r.op in _rules and not replace:
                old = _rules[r.op]
                raise RuleError(
                    f"{r.op} already has a rule ({old.module}.{getattr(old.strategy, '__name__', '?')}); "
                    "pass replace=True to replace it"
                )
        for r in new:
            policy: Policy | None = _policy_of.get(r.op, "measured") if r.op in _saved else None
            if policy is not None:
                _uninstall_ops([r.op])
            _rules[r.op] = r
            if policy is not None:  # active: decided again, by the policy it was installed with
                _install_ops([r.op], policy)


def unregister(op: Any) -> None:
    """Remove our rule for ``op`` (restoring upstream's if it is installed)."""
    o = _as_overload(op)
    with _lock:
        if o in _saved:
            _uninstall_ops([o])
        _rules.pop(o, None)


def rules() -> dict[OpOverload, Rule]:
    """A snapshot mapping op -> Rule of everything registered so far.

    ``import dtensor_rules`` has registered the shipped rules (it imports :mod:`dtensor_rules.op_rules`);
    the registry itself never imports op modules.
    """
    with _lock:
        return dict(_rules)


def get_rule(op: Any) -> Rule:
    """The :class:`Rule` of ``op``; :class:`RuleError` if it has none."""
    o = _as_overload(op)
    try:
        return _rules[o]
    except KeyError:
        raise RuleError(f"dtensor_rules has no rule for {o}") from None


# --------------------------------------------------------------------------- validation
def _count_tensor_args(schema: OpSchema) -> int:
    return num_tensor_inputs(schema)


def tensor_metas(args: Any) -> list[TensorMeta]:
    """The ``TensorMeta`` leaves of a single-dim rule's arguments, in order (the rules use it too)."""
    # TensorMeta is a NamedTuple: stop pytree from flattening it into its fields
    return [m for m in tree_leaves(args, is_leaf=lambda x: isinstance(x, TensorMeta)) if isinstance(m, TensorMeta)]


def check_rows(op: OpOverload, result: Any, args_meta: Any, kwargs_meta: Any, n_out: int) -> None:
    """Raise a RuleError naming the rule when a single-dim rule's rows are malformed."""
    if not isinstance(result, list):
        raise RuleError(f"rule for {op} returned {type(result).__name__}, expected a list of strategies")
    metas = tensor_metas((args_meta, kwargs_meta))
    width = n_out + len(metas)
    for s in result:
        if not isinstance(s, (list, tuple)) or len(s) != width:
            raise RuleError(
                f"rule for {op} returned strategy {s!r}: expected a list of {width} placements "
                f"({n_out} output(s) then {len(metas)} tensor input(s))"
            )
        for i, p in enumerate(s):
            t = type(p)
            if t is Replicate or t is Partial or (p is None and i < n_out):
                continue  # (exact types first: isinstance on a placement costs ~1 us on every dispatch)
            if t is not Shard and t is not ShardingPlaceholder and not isinstance(p, (Placement, ShardingPlaceholder)):
                raise RuleError(f"rule for {op} returned {p!r} in strategy {s!r}: not a Placement")
            dim = getattr(p, "dim", None)
            if dim is not None and i >= n_out:
                nd = len(metas[i - n_out].shape)
                if not 0 <= dim < max(nd, 1):
                    raise RuleError(
                        f"rule for {op} shards input {i - n_out} on dim {dim}, "
                        f"but that input has {nd} dims"
                    )


def _checked_single_dim(rule: Rule) -> Callable[..., Any]:
    """A single-dim rule's rows function, checked (malformed rows raise a RuleError naming the rule)."""
    return _checked_op_strategy(rule).rows  # type: ignore[union-attr]


class CheckedStrategy(NamedTuple):
    """An ``op_strategy`` rule as DTensor calls it: the rule, its output checked (a malformed one
    raises RuleError naming the rule). One layer, like :class:`SingleDimStrategy`."""

    rule: Callable[[OpSchema], Any]

    @property
    def __wrapped__(self) -> Callable[[OpSchema], Any]:
        return self.rule

    def __call__(self, op_schema: OpSchema) -> Any:
        result = self.rule(op_schema)
        _check_strategy(op_schema, result)
        return result


def _check_strategy(op_schema: OpSchema, result: Any) -> None:
    if not isinstance(result, (OpStrategy, TupleStrategy)):
        raise RuleError(
            f"rule for {op_schema.op} returned {type(result).__name__}, expected OpStrategy or TupleStrategy"
        )
    children = result.children if isinstance(result, TupleStrategy) else [result]
    n_in = len(op_schema.args_strategy) + len(op_schema.kwargs_strategy)
    for child in children:
        if not isinstance(child, OpStrategy) or not child.strategies:
            raise RuleError(f"rule for {op_schema.op} returned an empty or malformed strategy {child}")
        if isinstance(result, TupleStrategy):
            continue
        for spec in child.strategies:
            if spec.input_specs is not None and len(spec.input_specs) != n_in:
                raise RuleError(
                    f"rule for {op_schema.op}: strategy {spec} has {len(spec.input_specs)} input specs, "
                    f"the op has {n_in} tensor inputs"
                )
            if spec.redistribute_cost is None:
                raise RuleError(f"rule for {op_schema.op}: strategy {spec} has no redistribute_cost")


def _checked_op_strategy(rule: Rule) -> SingleDimStrategy | CheckedStrategy:
    """What DTensor calls for ``rule`` (``op_strategy_funcs[op]``), one layer above the rule: a
    single-dim rule as a :class:`~dtensor_rules.dispatch.single_dim.SingleDimStrategy` (rows
    checked, compact at dispatch, full expansion for solvers), an op_strategy rule as a
    :class:`CheckedStrategy`."""
    if rule.kind == "single_dim":
        return SingleDimStrategy(rule.op, rule.strategy, n_outputs(rule.op), rule.allow_uneven_sharding, check_rows)
    return CheckedStrategy(rule.strategy)


# --------------------------------------------------------------------------- install
def _has_upstream(prop: Any, op: OpOverload) -> bool:
    return any(op in getattr(prop, name) for name in _STRATEGY_REGISTRIES)


def is_shipped(rule: Rule) -> bool:
    """Whether ``rule`` is one this package ships (its strategy lives in ``dtensor_rules``): only
    those were measured against upstream (``_upstream/measured_*.json``)."""
    return rule.module == "dtensor_rules" or rule.module.startswith("dtensor_rules.")


def _why_ours_wins(rule: Rule, policy: Policy, upstream: bool) -> str | None:
    """The one install decision (install() and register(replace=True) alike): why ``rule`` goes
    into DTensor under ``policy``, or None where upstream's rule stays (see :func:`install`)."""
    if not upstream:
        return "ours: upstream has no rule"
    if policy == "fill":
        return None
    if policy == "override":
        return f"ours: installed with policy={policy!r}"
    if not is_shipped(rule):
        return (f"ours: your rule (from {rule.module or '?'}) is not measured; a registered rule wins over "
                "upstream's under policy='measured' (policy='fill' keeps upstream's)")
    verdict = measured_verdict(rule.op)
    return verdict.why if verdict.keep == "ours" else None


def _install_ops(ops: Sequence[OpOverload], policy: Policy) -> list[OpOverload]:
    prop = _propagator()
    done: list[OpOverload] = []
    try:
        for op in ops:
            rule = _rules[op]
            if op in _saved:
                done.append(op)
                continue
            why = _why_ours_wins(rule, policy, _has_upstream(prop, op))
            if why is None:
                continue
            _why_ours[op], _policy_of[op] = why, policy
            names = _ALL_REGISTRIES + ((_HANDLERS,) if rule.handler is not None else ())
            _saved[op] = {name: (op in _registry(name), _registry(name).get(op)) for name in names}
            done.append(op)  # before mutating, so a failure below is rolled back too
            for name in _ALL_REGISTRIES:
                getattr(prop, name).pop(op, None)
            # a single-dim rule goes in as an op_strategy: compact at dispatch, upstream's own
            # expansion of the same rows for every other query (dtensor_rules.dispatch.single_dim)
            prop.op_strategy_funcs[op] = _checked_op_strategy(rule)
            prop.op_to_schema_info[op] = rule.schema_info
            if rule.handler is not None:
                _registry(_HANDLERS)[op] = rule.handler
        _sync_meta_wrapper()
    except BaseException:
        # never leave the propagator half patched
        _uninstall_ops(done)
        raise
    finally:
        _clear_caches()
    return done


def _uninstall_ops(ops: Sequence[OpOverload]) -> None:
    for op in ops:
        saved = _saved.pop(op, None)
        _why_ours.pop(op, None)
        _policy_of.pop(op, None)
        if saved is None:
            continue
        for name, (present, value) in saved.items():
            registry = _registry(name)
            if present:
                registry[op] = value
            else:
                registry.pop(op, None)
    _sync_meta_wrapper()
    _clear_caches()


def _sync_meta_wrapper() -> None:
    """Keep the ``meta_fallback`` patch's table equal to the installed rules' fallbacks."""
    set_fallbacks({op: _rules[op].meta_fallback for op in _saved if _rules[op].meta_fallback is not None})


def _clear_caches() -> None:
    """Drop every cached sharding decision so neither side's decision is reused."""
    clear_sharding_caches()


def install(
    policy: Policy = "measured", ops: Sequence[Any] | None = None, patches: Sequence[str] | None = None
) -> list[OpOverload]:
    """Put our rules into DTensor's dispatch; returns the ops whose active rule is ours.

    Where upstream has no rule, ours is installed under every policy. Where it has one:
    ``policy="measured"`` (default) replaces it with a *shipped* rule only where that rule is
    measured strictly better on the running torch (``_upstream/measured_<version>.json``;
    :func:`status` says why per op), and always with a rule you registered yourself (it was
    never measured: registering it is the request); ``"override"`` always replaces it;
    ``"fill"`` never does. ``ops=[...]`` that stay upstream's under ``"measured"`` warn, naming
    the reason and ``policy="override"``.

    ``patches``: the named global changes to torch that are not rules (:mod:`dtensor_rules.patches`,
    docs/patches.md). None: a full install (``ops=None``) applies the ones correctness needs, an
    ``ops=`` install leaves them as they are; a list makes the applied set exactly those names.
    Idempotent: installing again changes nothing.
    """
    if policy not in _POLICIES:
        raise RuleError(f"unknown install policy {policy!r}: use one of {_POLICIES}")
    with _lock:
        targets = list(_rules) if ops is None else [_as_overload(o) for o in ops]
        missing = [o for o in targets if o not in _rules]
        if missing:
            raise RuleError(f"no dtensor_rules rule for {[str(o) for o in missing]}; registered: {sorted(map(str, _rules))}")
        if patches is not None:
            _check_patch_names(patches)
        done = _install_ops(targets, policy)
        if patches is not None:
            _patch_registry.set_applied(patches)
        elif ops is None:
            _patch_registry.apply(_patch_registry.defaults())
    if ops is not None and policy == "measured":
        _warn_kept(o for o in targets if o not in done)
    return done


def _check_patch_names(names: Sequence[str]) -> None:
    try:  # validated before anything changes
        _patch_registry.check_names(names)
    except _patch_registry.PatchError as e:
        raise RuleError(str(e)) from None


def _warn_kept(kept: Iterable[OpOverload]) -> None:
    """A loud word for each op an explicit install(ops=[...]) left to upstream."""
    import warnings

    for op in kept:
        why = measured_verdict(op).why
        warnings.warn(
            f"install(ops=[{op}]) kept upstream's rule under policy='measured' ({why}); "
            f"dtensor_rules.install(policy='override', ops=[{op}]) installs ours anyway",
            UserWarning,
            stacklevel=3,
        )


def uninstall(ops: Sequence[Any] | None = None) -> None:
    """Restore DTensor's registries for every op we patched (or just ``ops``); a full uninstall
    also restores every applied patch (torch's original objects back)."""
    with _lock:
        targets = list(_saved) if ops is None else [_as_overload(o) for o in ops]
        _uninstall_ops(targets)
        if ops is None:
            _patch_registry.restore()


def active_ops() -> list[OpOverload]:
    with _lock:
        return list(_saved)


@contextlib.contextmanager
def installed(
    policy: Policy = "measured", ops: Sequence[Any] | None = None, patches: Sequence[str] | None = None
) -> Iterator[list[OpOverload]]:
    """Context manager: our rules are active inside, the previous state is restored after."""
    with _lock:
        before = set(_saved)
        patched_before = _patch_registry.applied()
        now = install(policy, ops, patches)
    try:
        yield now
    finally:
        with _lock:
            _uninstall_ops([o for o in now if o not in before])
            _patch_registry.set_applied(patched_before)


class DeferredRule(NamedTuple):
    """A shipped rule whose op torch defines only later (``prims.fma``: when inductor is imported)."""

    name: str  # the op's name once defined, e.g. "prims.fma.default"
    waits_for: str  # the module whose import defines the op
    define: Callable[[], OpOverload]  # imports that module and registers the rule; returns the op
    patch: str  # the named patch that installs it at that import


_deferred: dict[str, DeferredRule] = {}


def defer(name: str, waits_for: str, define: Callable[[], OpOverload], patch: str) -> None:
    """Announce a shipped rule for an op torch defines later, so `status` and `validate` know it."""
    _deferred[name] = DeferredRule(name, waits_for, define, patch)


def _deferred_why(d: DeferredRule) -> str:
    if d.patch in _patch_registry.applied():
        return f"ours: installs when {d.waits_for} is imported"
    return f"not installed when {d.waits_for} is imported: patch {d.patch!r} is off"


def deferred() -> dict[str, DeferredRule]:
    """Announced rules whose op is not registered yet (name -> :class:`DeferredRule`)."""
    with _lock:
        registered = {str(op) for op in _rules}
    return {n: d for n, d in _deferred.items() if n not in registered}


class Status(dict):  # type: ignore[type-arg]
    """``status()``: op -> {"has", "active", "why"} as before, plus ``patches`` (name ->
    :class:`~dtensor_rules.patches.PatchState`) and ``deferred`` (op name -> when its rule arrives)."""

    patches: dict[str, _patch_registry.PatchState]
    deferred: dict[str, str]


def status() -> Status:
    """Per op with a rule here: who has a rule (``has``: "ours"/"both"), which is ``active``
    ("ours"/"upstream"/"none") and ``why`` (e.g. "ours: 54 correct vs upstream 14, upstream 2
    incorrect", "upstream kept: equal coverage (17 correct each)"). ``.patches``: every named
    global change with its state and reason; ``.deferred``: shipped rules whose op is not defined yet."""
    prop = _propagator()
    out = Status()
    with _lock:
        for op in _rules:
            upstream = (op in _saved and any(_saved[op][n][0] for n in _STRATEGY_REGISTRIES)) or (
                op not in _saved and _has_upstream(prop, op)
            )
            if op in _saved:
                active, why = "ours", _why_ours.get(op, "ours: installed")
            elif upstream:
                verdict = measured_verdict(op)
                active = "upstream"
                why = verdict.why if verdict.keep == "upstream" and is_shipped(_rules[op]) else "upstream: ours not installed"
            else:
                active, why = "none", "no rule active: ours not installed"
            out[op] = {"has": "both" if upstream else "ours", "active": active, "why": why}
        out.patches = _patch_registry.states()
        out.deferred = {n: _deferred_why(d) for n, d in deferred().items()}
    return out


def upstream_strategy(op: OpOverload) -> tuple[str, Any] | None:
    """Upstream's own rule for ``op`` (even while ours is installed), as (kind, fn)."""
    prop = _propagator()
    with _lock:
        if op in _saved:
            saved = _saved[op]
            entries = {n: v for n, (present, v) in saved.items() if present}
        else:
            entries = {n: getattr(prop, n)[op] for n in _ALL_REGISTRIES if op in getattr(prop, n)}
    if "op_single_dim_strategy_funcs" in entries:
        return "single_dim", entries["op_single_dim_strategy_funcs"]
    if "op_strategy_funcs" in entries:
        return "op_strategy", entries["op_strategy_funcs"]
    if "op_to_rules" in entries:
        return "prop_rule", entries["op_to_rules"]
    return None

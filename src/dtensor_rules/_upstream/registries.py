"""DTensor's sharding-rule registries: where rules live, and how to forget cached decisions.

The propagator keeps one dict per kind of rule (``STRATEGY_REGISTRIES``) and one per kind of
cache-key info (``SCHEMA_REGISTRIES``); the op dispatcher keeps custom per-op handlers
(``HANDLERS``). :mod:`dtensor_rules.registry` saves and restores entries of exactly these.
"""

from __future__ import annotations

from typing import Any

STRATEGY_REGISTRIES = ("op_strategy_funcs", "op_single_dim_strategy_funcs", "op_to_rules")
SCHEMA_REGISTRIES = ("op_to_schema_info", "op_to_schema_info_for_single_dim_strategy")
HANDLERS = "_custom_op_handlers"  # lives on DTensor._op_dispatcher, not on the propagator
# the propagator's uncached output-metadata step (fake-tensor propagation), wrapped per instance
META_STEP_ATTR = "_propagate_tensor_meta_non_cached"
# what DTensor's C++ dispatch calls back on a sharding-cache miss (shadowed by :mod:`.cache_miss`)
SLOW_PATH_ATTR = "_propagate_op_sharding_dispatch_slow_path"


def dispatcher() -> Any:
    """DTensor's op dispatcher (one per process)."""
    from torch.distributed.tensor import DTensor

    return DTensor._op_dispatcher


def propagator() -> Any:
    """DTensor's ``ShardingPropagator`` (one per process)."""
    return dispatcher().sharding_propagator


def propagate_schema(schema: Any) -> Any:
    """``propagator()``'s decision for ``schema``: cached in eager, not while tracing (SymInt shapes are unhashable;
    upstream's own ``ShardingPropagator.propagate`` makes the same choice)."""
    from torch.distributed._functional_collectives import _are_we_tracing

    p = propagator()
    return p.propagate_op_sharding_non_cached(schema) if _are_we_tracing() else p.propagate_op_sharding(schema)


def output_tensor_meta(schema: Any) -> Any:
    """The output metadata (``TensorMeta`` or a tuple of them) ``propagator()`` computes for
    ``schema`` by fake-tensor propagation before any rule is asked (uncached)."""
    return getattr(propagator(), META_STEP_ATTR)(schema)


def custom_op_handlers() -> dict[Any, Any]:
    """op -> handler(op, args, kwargs) for ops that bypass normal sharding propagation."""
    return dispatcher()._custom_op_handlers


def registry(name: str) -> dict[Any, Any]:
    """One of the dicts rules live in: a propagator registry or the custom handlers."""
    if name == HANDLERS:
        return custom_op_handlers()
    return getattr(propagator(), name)


def clear_sharding_caches() -> None:
    """Drop every cached sharding decision (C++ fast path, Python cache, tensor-meta cache).

    A profiler or logging tool may have replaced the propagator's cached methods with a plain
    wrapper (no ``cache_clear``): the cache is then found through ``__wrapped__`` or the
    wrapper's closure; if it cannot be found, a warning says so (once) instead of raising,
    since this also runs at someone else's import (the deferred ``prims.fma`` install).
    """
    # what ``torch.distributed.tensor.debug._clear_sharding_prop_cache`` does, without importing
    # ``debug`` (it pulls in dynamo and inductor: ~2 s and ~30 MiB at ``import dtensor_rules``)
    import torch

    prop = propagator()
    torch._C._clear_DTensor_sharding_propagator_cache()
    for name in ("propagate_op_sharding", "_propagate_tensor_meta_cached"):
        fn = getattr(prop, name, None)
        if not _clear_cache_of(fn) and name not in _uncleared:
            import warnings

            _uncleared.add(name)
            warnings.warn(
                f"dtensor_rules: DTensor's ShardingPropagator.{name} is replaced by {fn!r}, which has no "
                "cache_clear() and wraps nothing reachable (__wrapped__ or closure) that has one; sharding "
                "decisions cached before this install/uninstall may be reused. Wrap with functools.wraps to avoid it.",
                RuntimeWarning,
                stacklevel=3,
            )


_uncleared: set[str] = set()  # caches we already warned about


def _clear_cache_of(fn: Any, depth: int = 0) -> bool:
    """Call the ``cache_clear`` of ``fn`` or of what it wraps (``__wrapped__``, closure cells)."""
    if fn is None or depth > 4:
        return False
    clear = getattr(fn, "cache_clear", None)
    if callable(clear):
        clear()
        return True
    inner = [getattr(fn, "__wrapped__", None)]
    inner += [c.cell_contents for c in (getattr(getattr(fn, "__func__", fn), "__closure__", None) or ())
              if _filled(c) and callable(c.cell_contents)]
    return any(_clear_cache_of(f, depth + 1) for f in inner if f is not None)


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises ValueError
    except ValueError:
        return False
    return True


def propagate(op_info: Any) -> None:
    """Run the propagator on an ``OpInfo`` (fills ``op_info.output_sharding``)."""
    propagator().propagate(op_info)


def dispatch_slow_path(op_call: Any, args: Any, kwargs: Any) -> Any:
    """Upstream's Python dispatch path for one call: propagate, redistribute, run, wrap."""
    d = dispatcher()
    op_info = d.unwrap_to_op_info(op_call, args, kwargs)
    d.sharding_propagator.propagate(op_info)
    return dispatch_propagated(op_call, args, op_info)


def dispatch_propagated(op_call: Any, args: Any, op_info: Any) -> Any:
    """The rest of upstream's path for a call already propagated: redistribute, run, wrap."""
    d = dispatcher()
    local = d._dispatch_get_local_results_slow_path(op_call, args, op_info)
    return d.wrap(local, op_info.output_sharding.output_spec)


def input_targets(op_info: Any) -> list[Any]:
    """The layouts a propagated call's flat args must take: specs (tensors) and the other args as is."""
    sharding = op_info.output_sharding
    if sharding.needs_redistribute:
        import torch.utils._pytree as pytree

        return list(pytree.tree_leaves(sharding.redistribute_schema.args_schema))
    return list(op_info.flat_args_schema)


def redistribute_args_to(op_info: Any, targets: Any) -> None:
    """Redistribute a call's local tensor args to ``targets`` (as :func:`input_targets` orders them)."""
    from dtensor_rules._upstream.types import OpSchema

    dispatcher().redistribute_local_args(op_info, OpSchema(op_info.schema.op, tuple(targets), {}), False)


def wrap_result(local: Any, spec: Any) -> Any:
    """A local result as the DTensor(s) ``spec`` describes (upstream's wrap)."""
    return dispatcher().wrap(local, spec)


def dispatch_with_local_fix(op_call: Any, args: Any, kwargs: Any, fix_local: Any) -> Any:
    """Upstream's Python dispatch path with ``fix_local(tensor)`` applied to every local tensor
    argument after redistribution, right before the local op runs (e.g. re-lay out a shard)."""
    import dataclasses

    import torch

    d = dispatcher()
    op_info = d.unwrap_to_op_info(op_call, args, kwargs)
    d.sharding_propagator.propagate(op_info)
    sharding = op_info.output_sharding
    if sharding.needs_redistribute:
        d.redistribute_local_args(op_info, sharding.redistribute_schema, sharding.use_val_from_redistribute_schema)
        op_info.output_sharding = dataclasses.replace(sharding, needs_redistribute=False)
    op_info.local_args = tuple(fix_local(a) if isinstance(a, torch.Tensor) else a for a in op_info.local_args)
    local = d._dispatch_get_local_results_slow_path(op_call, args, op_info)
    return d.wrap(local, sharding.output_spec)


def unwrap_to_op_info(op_call: Any, args: Any, kwargs: Any) -> Any:
    """DTensor's ``OpInfo`` for one call: ``schema`` (specs), ``local_args``/``local_kwargs``, mesh."""
    return dispatcher().unwrap_to_op_info(op_call, args, kwargs)

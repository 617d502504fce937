"""Rules for ops defined after ``import dtensor_rules``: two named patches that register them when the op appears.

- ``deferred_fma``: ``prims.fma`` exists only once ``torch._inductor.inductor_prims`` is imported
  (~2 s, never by ``import dtensor_rules``); upstream registers its generic pointwise rule for it at
  that moment, and this patch registers ours (``op_rules/fma.py``) right after it.
- ``torchtitan_rules``: torchtitan defines its custom ops when its modules are imported; a
  post-import hook on each defining module registers their rules (``op_rules/torchtitan_ops.py``).

Until then ``status().deferred`` lists the rules as waiting. Either rule is installed on arrival
when the package's rules are installed.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from torch._ops import OpOverload

from dtensor_rules._upstream import on_prims_fma_defined, prims_fma_defined
from dtensor_rules._upstream.post_import import when_imported
from dtensor_rules.op_rules.fma import define_fma, register_fma_rule
from dtensor_rules.op_rules.torchtitan_ops import TORCHTITAN_OPS
from dtensor_rules.patches import Patch, guarded, register

_INDUCTOR_PRIMS = "torch._inductor.inductor_prims"
_TORCHTITAN_MODULES = sorted({s.module for s in TORCHTITAN_OPS})


def _install_if_active(ops: list[OpOverload]) -> None:
    from dtensor_rules import registry

    if registry.active_ops():  # our rules are installed: these too (after upstream's, for fma)
        registry.install(ops=ops)


_cancel_fma: list[Callable[[], None]] = []


def _apply_fma() -> None:
    _cancel_fma.append(on_prims_fma_defined(guarded("deferred_fma", lambda: _install_if_active([register_fma_rule()]))))


def _restore_fma() -> None:
    _cancel_fma.pop()()


def _on_torchtitan_import(module_name: str) -> Callable[[Any], None]:
    def run(_module: Any) -> None:
        _install_if_active([s.register() for s in TORCHTITAN_OPS if s.module == module_name and s.defined()])

    return run


_cancel_torchtitan: list[Callable[[], None]] = []


def _apply_torchtitan() -> None:
    for module_name in _TORCHTITAN_MODULES:
        _cancel_torchtitan.append(when_imported(module_name, guarded("torchtitan_rules", _on_torchtitan_import(module_name))))


def _restore_torchtitan() -> None:
    while _cancel_torchtitan:
        _cancel_torchtitan.pop()()


def _register() -> None:
    from dtensor_rules import registry

    registry.defer("prims.fma.default", _INDUCTOR_PRIMS, define_fma, patch="deferred_fma")
    register(Patch(
        name="deferred_fma",
        apply=_apply_fma,
        restore=_restore_fma,
        changes="torch.distributed.tensor._ops._pointwise_ops.register_inductor_prims (until inductor is "
        "imported): wrapped so that, right after upstream registers its prims.fma rule, ours is registered "
        "and installed; upstream's function is put back at that moment",
        reason="prims.fma exists only once torch._inductor.inductor_prims is imported (~2 s, never by "
        "import dtensor_rules); compiled softmax backward decomposes into it",
        upstream="missing: upstream's prims.fma rule is the generic pointwise one (registered when inductor is "
        "imported): no Partial rows, so a Partial addend or factor is reduced first (checked: torch 2.13.0, 2.14.1)",
        required=True,
        waits_for=_INDUCTOR_PRIMS,
        pending=lambda: not prims_fma_defined(),
    ))
    for s in TORCHTITAN_OPS:
        registry.defer(f"torchtitan.{s.name}.default", s.module, s.define, patch="torchtitan_rules")
    register(Patch(
        name="torchtitan_rules",
        apply=_apply_torchtitan,
        restore=_restore_torchtitan,
        changes="a post-import hook (sys.meta_path) on " + ", ".join(_TORCHTITAN_MODULES)
        + ": when torchtitan defines its custom ops there, their DTensor rules are registered (and installed if "
        "ours are); nothing of torchtitan is imported by the package",
        reason="torchtitan's custom ops (deterministic_scatter_add in its MoE combine, silu_and_mul, the fused MLA "
        "rope ops, the helion rope ops) have no sharding strategy, so its MoE written on DTensors stops at them",
        upstream="missing: torchtitan's custom ops (torchtitan::deterministic_scatter_add, silu_and_mul, ...) have no "
        "DTensor sharding strategy in torch or torchtitan (checked: torch 2.13.0, 2.14.1; torchtitan 0.3.0)",
        required=True,
        waits_for=", ".join(_TORCHTITAN_MODULES),
        pending=lambda: any(s.module not in sys.modules for s in TORCHTITAN_OPS),
    ))


_register()

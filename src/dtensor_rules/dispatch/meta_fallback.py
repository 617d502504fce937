"""The ``meta_fallback`` patch: DTensor's output-metadata step, with a rule's fallback when it fails.

On a sharding-cache miss DTensor computes the op's output metadata with fake tensors
(``ShardingPropagator._propagate_tensor_meta_non_cached``) before any rule is consulted. Where
that fails for an input the op accepts on real devices (``_grouped_mm`` of non-bf16 operands on a
CPU fake kernel), a rule registered with ``meta_fallback=fn`` answers instead:
``fn(op_schema, error) -> TensorMeta``. This patch is that hook: an instance attribute shadowing
the method (the class method shows through again when restored) plus a logging filter dropping
fake-tensor's ERROR traceback for failures a fallback handles. For every other op it adds one
frame and a ``try`` (no work unless the step raises). The registry keeps :data:`FALLBACKS` equal
to the fallbacks of the installed rules (:func:`set_fallbacks`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from dtensor_rules import patches
from dtensor_rules._upstream import FAKE_TENSOR_LOGGER, META_FAILURE_MESSAGE, META_STEP_ATTR, propagator

__all__ = ["FALLBACKS", "set_fallbacks", "wrapped"]

# op -> fn(op_schema, error) -> TensorMeta, for the installed rules that have one
FALLBACKS: dict[Any, Callable[..., Any]] = {}


def set_fallbacks(fallbacks: Mapping[Any, Callable[..., Any]]) -> None:
    """Make the installed rules' fallbacks exactly ``fallbacks`` (the registry calls this)."""
    FALLBACKS.clear()
    FALLBACKS.update(fallbacks)


def wrapped() -> bool:
    """Whether the patch is in effect."""
    return META_STEP_ATTR in vars(propagator())


def _quiet_handled(record: logging.LogRecord) -> bool:
    """Drop fake-tensor's ERROR traceback for an op whose fallback handles the failure (it answers
    or re-raises the error to the caller, so the log only adds noise)."""
    args = record.args if isinstance(record.args, tuple) else ()
    return not (record.msg == META_FAILURE_MESSAGE and args and args[0] in FALLBACKS)


def _apply() -> None:
    prop = propagator()
    if wrapped():
        return
    original = getattr(prop, META_STEP_ATTR)

    def propagate_tensor_meta(op_schema: Any) -> Any:
        try:
            return original(op_schema)
        except Exception as err:
            fallback = FALLBACKS.get(op_schema.op)
            if fallback is None:
                raise
            return fallback(op_schema, err)

    setattr(prop, META_STEP_ATTR, propagate_tensor_meta)
    logging.getLogger(FAKE_TENSOR_LOGGER).addFilter(_quiet_handled)


def _restore() -> None:
    prop = propagator()
    if wrapped():
        delattr(prop, META_STEP_ATTR)  # the class method shows through again
    logging.getLogger(FAKE_TENSOR_LOGGER).removeFilter(_quiet_handled)


patches.register(patches.Patch(
    name="meta_fallback",
    changes="ShardingPropagator._propagate_tensor_meta_non_cached (an instance attribute shadowing the method) "
    "and a logging filter on torch._subclasses.fake_tensor",
    reason="a rule's meta_fallback answers where DTensor's fake-tensor output-metadata step fails for inputs the op "
    "accepts (_grouped_mm of non-bf16 operands); other ops pass straight through",
    upstream="defect: the meta (fake-tensor) kernel of aten._grouped_mm rejects fp32 operands that the CPU kernel "
    "accepts, so DTensor's output-metadata step fails for them (checked: torch 2.13.0, 2.14.1)",
    required=True,
    apply=_apply,
    restore=_restore,
))

"""The ``unbacked_sharding`` patch: our scan / gather-scatter / indexing / counting rules expand
with ``allow_unbacked_sharding=False`` (applied by ``dtensor_rules.install()``).

DTensor's expansion checks every input layout with ``is_tensor_shardable``; with the default
(None) a dim of unbacked size (``mark_unbacked``, ``.item()``, ``nonzero``) makes it guard on
``u0 < num_shards`` and compilation fails ("Could not guard on data-dependent expression").
False answers "unknown" with "not shardable anew" (a safe, smaller strategy set); an input that
is already sharded on that dim keeps its layout (uneven / empty shards are valid for these rules).
The proper home is the registry passing this field for every rule; until then this patch sets it
on the installed entries of the families below, and ``uninstall()`` puts upstream's None back.
"""

from __future__ import annotations

from dtensor_rules._upstream import set_unbacked_sharding

FAMILIES = ("dtensor_rules.ops.scan", "dtensor_rules.ops.gather_scatter", "dtensor_rules.ops.indexing", "dtensor_rules.ops.counting")


def _ops() -> list[object]:
    from dtensor_rules import registry

    return [op for op, rule in registry.rules().items() if rule.module in FAMILIES and rule.kind == "single_dim"]


def _apply() -> None:
    for op in _ops():
        set_unbacked_sharding(op, False)


def _restore() -> None:
    for op in _ops():
        set_unbacked_sharding(op, None)


def _register() -> None:
    from dtensor_rules.registry import register_patch

    register_patch("unbacked_sharding", _apply, _restore)


_register()

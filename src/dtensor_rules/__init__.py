"""dtensor_rules: complete, proven DTensor sharding rules for MoE ops, cost formulas,
and an ordered-mesh redistribute planner.

``import dtensor_rules`` registers the shipped rules (it imports :mod:`dtensor_rules.op_rules`,
whose modules each state their ops' contracts with ``register(...)``; the registry imports no
op module) and installs them into DTensor's dispatch (policy "measured": ours where upstream
has no rule, or where ours is measured strictly better on this torch release; ``status()``
says which and why) unless the environment variable ``DTENSOR_RULES_NO_INSTALL=1`` is set.
The install also applies the named patches correctness needs (global changes that are not
rules: ``status().patches``, docs/patches.md; ``install(patches=[...])`` switches them).
Tested on torch 2.13 and 2.14 (setup.py: ``torch>=2.13,<2.15``).

One exception, so the command line answers ``--help`` and typos at once: while
``python -m dtensor_rules`` (or the ``dtensor-rules`` script) starts, this module defers
importing torch; the chosen command calls :func:`load` (any missing attribute loads too).
"""

# The module's own imports go under private names: the top level holds the documented API only.
import os as _os
import sys as _sys

_MIN_TORCH = (2, 13)
__version__ = "0.1.0"
__all__ = [
    "Rule",
    "RuleError",
    "distribute_tensor",
    "get_rule",
    "install",
    "installed",
    "load",
    "plan",
    "redistribute_with_order",
    "register",
    "rules",
    "status",
    "uninstall",
]
_loaded = False


def _check_torch() -> None:
    try:
        import torch
    except ImportError as e:  # pragma: no cover - exercised only without torch
        raise ImportError("dtensor_rules needs PyTorch >= 2.13: pip install torch==2.13.0") from e
    version = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    if version < _MIN_TORCH:
        raise ImportError(
            f"dtensor_rules needs torch >= {_MIN_TORCH[0]}.{_MIN_TORCH[1]}, found {torch.__version__}; "
            "upgrade with: pip install 'torch==2.13.0'"
        )
    from dtensor_rules._upstream.version import TESTED_TORCH

    if version > max(TESTED_TORCH):
        import warnings

        newest = ".".join(map(str, max(TESTED_TORCH)))
        warnings.warn(
            f"dtensor_rules is tested on torch {_MIN_TORCH[0]}.{_MIN_TORCH[1]} to {newest}, found {torch.__version__}: "
            "upstream's private DTensor internals may have changed (tests/test_upstream_contract.py checks them), "
            "and install() keeps upstream's rule wherever it has one (no measurement for this release)",
            stacklevel=2,
        )


def load() -> None:
    """Import torch, register the shipped rules, install them and the default patches (idempotent)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    _check_torch()
    from dtensor_rules import compile_patches  # noqa: F401  (registers what compiled DTensor code needs)
    from dtensor_rules import op_rules  # noqa: F401  (the one place that loads the shipped rules)
    from dtensor_rules import deferred_rules  # noqa: F401  (rules of ops defined later: inductor's fma, torchtitan's)
    from dtensor_rules import registry
    from dtensor_rules.redistribute import distribute_tensor, plan
    from dtensor_rules.redistribute import redistribute as redistribute_with_order

    # ``dtensor_rules.redistribute`` stays the planner *package* (``import dtensor_rules.redistribute as rd``);
    # its ``redistribute`` function is exposed here under a name that does not shadow it.
    names = ("Rule", "RuleError", "get_rule", "install", "installed", "register", "rules", "status", "uninstall")
    globals().update({n: getattr(registry, n) for n in names})
    globals().update(distribute_tensor=distribute_tensor, plan=plan, redistribute_with_order=redistribute_with_order)
    if _os.environ.get("DTENSOR_RULES_NO_INSTALL", "") not in ("1", "true", "True"):
        registry.install()


def __getattr__(name: str) -> object:  # only reached for names not loaded yet (the CLI's deferred start)
    if not _loaded and not name.startswith("__"):
        load()
        if name in globals():
            return globals()[name]
    raise AttributeError(f"module 'dtensor_rules' has no attribute {name!r}")


def _cli_starting() -> bool:
    """True while ``python -m dtensor_rules ...`` locates its __main__ or the console script starts."""
    if _os.path.basename(_sys.argv[0] if _sys.argv else "") == "dtensor-rules":
        return True
    if _sys.argv[:1] != ["-m"]:  # runpy sets argv[0] = "-m" only while it imports the -m target's packages
        return False
    argv = list(getattr(_sys, "orig_argv", ()))
    return any(a == "-mdtensor_rules" or (a == "-m" and argv[i + 1: i + 2] == ["dtensor_rules"]) for i, a in enumerate(argv))


if not _cli_starting():
    load()

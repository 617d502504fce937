"""The upstream contract: every private torch symbol the adapter relies on, checked in one test.

When a torch release renames or removes some, the failure lists exactly the entries that changed,
each naming the symbol and what is missing; the fix is a shim in ``src/dtensor_rules/_upstream/``.
"""

from __future__ import annotations

import importlib
import inspect
import re

from dtensor_rules._upstream import TESTED_TORCH, TORCH_VERSION
from dtensor_rules._upstream.contract import REQUIREMENTS, Requirement


def _params(obj: object) -> set[str]:
    try:
        return set(inspect.signature(obj).parameters)
    except (TypeError, ValueError):  # a builtin without a signature: nothing to check against
        return set()


def broken(req: Requirement) -> list[str]:
    """What this torch lacks of one requirement (empty: it holds)."""
    try:
        module = importlib.import_module(req.module)
    except ImportError as e:
        return [f"{req.module} does not import ({e})"]
    if not hasattr(module, req.name):
        return [f"{req.module} has no {req.name} ({req.why or 'used by the adapter'})"]
    obj = getattr(module, req.name)
    problems = []
    if req.params or req.any_of:
        params = _params(obj)
        missing = [p for p in req.params if p not in params]
        if missing:
            problems.append(f"{req.module}.{req.name} lost parameter(s) {missing}; it takes {sorted(params)}")
        if req.any_of and not any(p in params for p in req.any_of):
            problems.append(f"{req.module}.{req.name} takes none of {req.any_of} (a renamed keyword?); it takes {sorted(params)}")
    for attr in req.attrs:
        has = hasattr(obj, attr) or attr in getattr(obj, "__annotations__", {}) or attr in _slots_or_fields(obj)
        if not has:
            problems.append(f"{req.module}.{req.name} has no attribute {attr!r} ({req.why or 'used by the adapter'})")
    return problems


def test_every_upstream_symbol_the_adapter_needs() -> None:
    assert len(REQUIREMENTS) > 30
    problems = [p for req in REQUIREMENTS for p in broken(req)]
    assert not problems, f"torch {TORCH_VERSION} breaks the upstream contract:\n  " + "\n  ".join(problems)


def test_the_contract_check_names_what_is_missing() -> None:
    """Negative control: a missing symbol, a lost parameter, a renamed keyword and a lost attribute."""
    assert broken(Requirement("torch.distributed.tensor", "no_such_symbol")) == [
        "torch.distributed.tensor has no no_such_symbol (used by the adapter)"]
    [lost] = broken(Requirement("torch.distributed.tensor", "distribute_tensor", params=("no_such_param",)))
    assert "distribute_tensor lost parameter(s) ['no_such_param']" in lost
    [renamed] = broken(Requirement("torch.distributed.tensor", "distribute_tensor", any_of=("a", "b")))
    assert "takes none of ('a', 'b')" in renamed
    [attr] = broken(Requirement("torch.distributed.tensor", "DTensor", attrs=("no_such_attr",)))
    assert "DTensor has no attribute 'no_such_attr'" in attr


def _slots_or_fields(obj: object) -> set[str]:
    """Instance attributes declared on a class: dataclass fields, slots, or set in __init__."""
    names: set[str] = set(getattr(obj, "__dataclass_fields__", {}))
    for klass in getattr(obj, "__mro__", ()):
        names |= set(getattr(klass, "__slots__", ()))
        init = vars(klass).get("__init__")
        if init is not None:
            try:
                names |= set(re.findall(r"self\.(\w+)\s*[:=]", inspect.getsource(init)))
            except (OSError, TypeError):
                pass
    return names


def test_running_torch_is_a_tested_release() -> None:
    assert TORCH_VERSION in TESTED_TORCH, (
        f"torch {TORCH_VERSION} is not among the tested releases {TESTED_TORCH}: run this suite on it, "
        "fix the contract failures in src/dtensor_rules/_upstream/, then add it to TESTED_TORCH and setup.py"
    )


def test_expand_to_mesh_passes_the_filter_under_this_torch() -> None:
    """The filter keyword the adapter picked is the one this torch's expansion accepts."""
    from dtensor_rules._upstream import strategy

    assert strategy.FILTER_KWARG in inspect.signature(strategy._ops_utils.expand_to_full_mesh_op_strategy).parameters

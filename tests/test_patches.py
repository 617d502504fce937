"""Every global change beyond installing rules is a named patch: listed by status() with its reason,
the upstream gap it stands in for and its state, documented in docs/patches.md, switchable by name,
restored exactly by uninstall(). Patches register through one API, ``patches.register``.

The oracle is torch's own objects, read in a fresh interpreter before ``import dtensor_rules``:
after ``uninstall()`` each must be the very same object again, and modules imported afterwards
(flop counter, DCP, inductor's prims) must come out as torch alone makes them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import dtensor_rules
from dtensor_rules import patches, registry
from dtensor_rules.registry import RuleError

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "patches.md"
# every patch the package ships, and whether correctness needs it (on by default)
SHIPPED = {
    "hinted_strategy_costs": False,  # optional (compile time only), but on by default: ON_BY_DEFAULT
    "first_symbol_record": True,
    "exact_int_partition": True,
    "cache_miss_hook": True,
    "meta_fallback": True,
    "shard_order": True,
    "checkpoint_shard_order": True,
    "flop_registry": True,
    "deferred_fma": True,
    "torchtitan_rules": True,
}
ON_BY_DEFAULT = {n for n, required in SHIPPED.items() if required} | {"hinted_strategy_costs"}


def run_fresh(code: str, **env: str) -> str:
    full = dict(os.environ, PYTHONPATH=str(ROOT / "src"), **env)  # this checkout, not an installed copy
    if "DTENSOR_RULES_NO_INSTALL" not in env:
        full.pop("DTENSOR_RULES_NO_INSTALL", None)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full,
                          timeout=600)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc.stderr


def test_status_lists_every_patch_with_its_reason_state_and_default() -> None:
    states = dtensor_rules.status().patches
    assert {n: s.required for n, s in states.items()} == SHIPPED
    for s in states.values():
        assert s.reason and s.changes and s.state.startswith(("on", "off")), s
        assert s.upstream.startswith(patches.UPSTREAM_KINDS) and "(checked: torch 2.13.0, 2.14.1" in s.upstream, s
    assert {n: s.default for n, s in states.items()} == {n: n in ON_BY_DEFAULT for n in SHIPPED}
    assert set(patches.applied()) == set(patches.defaults()) == ON_BY_DEFAULT


def test_docs_page_lists_every_patch_and_how_to_turn_it_off() -> None:
    text = DOC.read_text()
    documented = re.findall(r"^### `([a-z_]+)`", text, flags=re.M)
    assert sorted(documented) == sorted(SHIPPED)
    table = dict(re.findall(r"^\| `([a-z_]+)` \| (.+) \|$", text, flags=re.M))
    assert set(SHIPPED) <= set(table), sorted(table)
    for name in SHIPPED:
        assert f"test_the_upstream_gap_is_still_there[{name}]" in table[name], name
    for name in SHIPPED:
        section = text.split(f"### `{name}`", 1)[1].split("\n### ", 1)[0]
        assert "Changes" in section and "Why" in section and "Off" in section, name
    for page in (ROOT / "README.md", ROOT / "docs" / "index.md"):
        assert "patches.md" in page.read_text(), page


def test_install_switches_patches_by_name_and_rejects_unknown_ones() -> None:
    from dtensor_rules._upstream import cache_miss_wrapped

    try:
        registry.install(patches=[n for n in patches.defaults() if n != "cache_miss_hook"])
        assert not cache_miss_wrapped()
        assert dtensor_rules.status().patches["cache_miss_hook"].state == "off"
        with pytest.raises(RuleError, match="unknown patch.*'no_such'.*first_symbol_record"):
            registry.install(patches=["no_such"])
        assert "no_such" not in patches.applied() and "first_symbol_record" in patches.applied()  # nothing changed
        with registry.installed(patches=["cache_miss_hook"]):
            assert patches.applied() == ["cache_miss_hook"] and cache_miss_wrapped()
        assert "cache_miss_hook" not in patches.applied() and "first_symbol_record" in patches.applied()
    finally:
        registry.install(patches=patches.defaults())
    assert cache_miss_wrapped()


def test_one_registration_api_that_names_the_upstream_gap() -> None:
    assert not hasattr(registry, "register_patch") and "register_patch" not in registry.__all__
    src = ROOT / "src" / "dtensor_rules"
    users = [p.relative_to(src) for p in src.rglob("*.py") if "register_patch" in p.read_text()]
    assert not users, users
    noop = lambda: None  # noqa: E731
    with pytest.raises(patches.PatchError, match="upstream= must start with 'defect: ' or 'missing: '"):
        patches.register(patches.Patch(name="no_gap_named", changes="x", reason="y", upstream="", required=False,
                                       apply=noop, restore=noop))
    assert "no_gap_named" not in patches.names()
    with pytest.raises(patches.PatchError, match="already registered"):
        patches.register(patches.Patch(name="shard_order", changes="x", reason="y", required=False, apply=noop,
                                       restore=noop, upstream="defect: z (checked: torch 2.13.0, 2.14.1)"))


def test_meta_fallback_is_a_switchable_patch_that_restores_the_method() -> None:
    """The output-metadata wrapper is its own named patch: off, the propagator's class method
    shows through and a grouped mm of fp32 operands fails in the meta step as upstream's does;
    on, the rule's fallback answers (its result equals plain torch's)."""
    from torch.distributed.tensor import DTensor, Replicate

    from dtensor_rules._upstream import META_STEP_ATTR, clear_sharding_caches, propagator
    from dtensor_rules.testing import simulated_mesh

    a, b = torch.randn(8, 16), torch.randn(2, 16, 8)
    offs = torch.tensor([4, 8], dtype=torch.int32)
    want = torch._grouped_mm(a, b, offs=offs)
    try:
        registry.install(patches=[n for n in patches.defaults() if n != "meta_fallback"])
        assert META_STEP_ATTR not in vars(propagator())
        assert dtensor_rules.status().patches["meta_fallback"].state == "off"
        with simulated_mesh((2,)) as mesh:
            da, db, do = (DTensor.from_local(t, mesh, [Replicate()], run_check=False) for t in (a, b, offs))
            clear_sharding_caches()
            with pytest.raises(Exception):
                torch._grouped_mm(da, db, offs=do)
            registry.install(patches=patches.defaults())
            assert META_STEP_ATTR in vars(propagator())
            clear_sharding_caches()
            got = torch._grouped_mm(da, db, offs=do).full_tensor()
        torch.testing.assert_close(got, want)
    finally:
        registry.install(patches=patches.defaults())


SNAPSHOT = """
import sys
import torch
import torch.distributed.tensor
import torch.fx.experimental.proxy_tensor as proxy_tensor
import torch.distributed.tensor._ops._pointwise_ops as pointwise
import torch.distributed._local_tensor as local_tensor
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._dtensor_spec import DTensorSpec
from torch.distributed.tensor.placement_types import Partial
from torch.distributed.tensor import _api, _dispatch, _redistribute
from torch.distributed.tensor._ops import utils as ops_utils

def snapshot():
    d = DTensor._op_dispatcher
    p = d.sharding_propagator
    regs = ("op_strategy_funcs", "op_single_dim_strategy_funcs", "op_to_rules", "op_to_schema_info",
            "op_to_schema_info_for_single_dim_strategy")
    return {
        "tracker": proxy_tensor._init_proxy_trackers,
        "strategy_pricing": ops_utils.redistribute_cost,
        "partition": Partial.__dict__["_partition_value"],
        "shallow_copy": DTensorSpec.__dict__["shallow_copy_with_tensor_meta"],
        "slow_path": vars(d).get("_propagate_op_sharding_dispatch_slow_path"),
        "meta_step": vars(p).get("_propagate_tensor_meta_non_cached"),
        "inductor_prims": pointwise.register_inductor_prims,
        "per_rank_run": local_tensor._for_each_rank_run_func,
        "per_rank_map": local_tensor._map_to_rank_local_val,
        "meta_path": list(sys.meta_path),
        "redistribute": DTensor.__dict__["redistribute"],
        "redistribute_local": [m.redistribute_local_tensor for m in (_redistribute, _dispatch, _api)],
        "distribute": [_api.distribute_tensor, torch.distributed.tensor.distribute_tensor],
        "handlers": dict(d._custom_op_handlers),
        **{r: dict(getattr(p, r)) for r in regs},
    }

def same(a, b):
    diff = []
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, dict):
            if x.keys() != y.keys() or any(x[i] is not y[i] for i in x):
                diff.append(k)
        elif isinstance(x, list):
            if len(x) != len(y) or any(i is not j for i, j in zip(x, y)):
                diff.append(k)
        elif x is not y:
            diff.append(k)
    return diff
"""


@pytest.mark.slow
def test_uninstall_gives_back_torchs_own_objects_and_later_imports_stay_pristine() -> None:
    run_fresh(SNAPSHOT + textwrap.dedent("""
        pristine = snapshot()
        import dtensor_rules
        installed = snapshot()
        changed = same(pristine, installed)
        assert {"tracker", "partition", "shallow_copy", "slow_path", "meta_step", "inductor_prims", "meta_path",
                "strategy_pricing"} <= set(changed), changed
        # torch's own: DTensor's moves, and LocalTensorMode's loop (simulated_mesh() scopes its RNG fix)
        assert not {"redistribute", "redistribute_local", "distribute", "per_rank_run", "per_rank_map"} & set(changed), changed
        dtensor_rules.uninstall()
        assert same(pristine, snapshot()) == [], same(pristine, snapshot())
        assert all(s.state == "off" for s in dtensor_rules.status().patches.values())
        # what would have completed at these imports does not fire any more
        from torch.utils.flop_counter import flop_registry
        assert not any(getattr(f, "__name__", "").startswith("dtensor_rules") for f in flop_registry.values())
        import torch.distributed.checkpoint.planner_helpers as ph
        assert ph._create_chunk_from_dtensor.__module__ == ph.__name__
        import torch._inductor.inductor_prims
        fma = torch.ops.prims.fma.default
        p = DTensor._op_dispatcher.sharding_propagator
        assert fma in p.op_single_dim_strategy_funcs or fma in p.op_strategy_funcs  # upstream's rule, as torch alone
        assert fma not in dtensor_rules.status() and not any(f.__module__.startswith("dtensor_rules") for f in
            (p.op_single_dim_strategy_funcs.get(fma), p.op_strategy_funcs.get(fma)) if f is not None)
        print("OK")
    """))


@pytest.mark.slow
def test_no_install_changes_nothing_in_torch() -> None:
    run_fresh(SNAPSHOT + textwrap.dedent("""
        pristine = snapshot()
        import dtensor_rules
        assert same(pristine, snapshot()) == [], same(pristine, snapshot())
        assert dtensor_rules.status().patches and all(s.state == "off" for s in dtensor_rules.status().patches.values())
        why = dtensor_rules.status().deferred["prims.fma.default"]
        assert why == "not installed when torch._inductor.inductor_prims is imported: patch 'deferred_fma' is off", why
        print("OK")
    """), DTENSOR_RULES_NO_INSTALL="1")


# the names DTensor's redistribution and distribution go through; no patch of the package replaces any of them
MOVE_NAMES = ("redistribute_local_tensor", "distribute_tensor", "redistribute")


@pytest.mark.slow
def test_import_leaves_dtensors_redistribute_and_distribute_as_torchs_own() -> None:
    """After ``import dtensor_rules`` (rules and default patches installed), ``DTensor.redistribute``,
    every module binding of ``redistribute_local_tensor`` and ``distribute_tensor`` (scanned over
    every loaded ``torch.distributed.tensor`` module, ``_api``/``_dispatch``/``_redistribute``
    among them) and every class attribute of those names are the objects torch alone made."""
    proc = subprocess.run([sys.executable, "-c", (
        "import torch.distributed.tensor as t, torch.distributed.tensor._redistribute as r; "
        "a=(t.DTensor.redistribute, r.redistribute_local_tensor, t.distribute_tensor); import dtensor_rules; "
        "print(a == (t.DTensor.redistribute, r.redistribute_local_tensor, t.distribute_tensor))")],
        capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT / "src")), timeout=600)
    assert proc.returncode == 0 and proc.stdout.split() == ["True"], proc.stdout + proc.stderr[-3000:]
    run_fresh(textwrap.dedent(f"""
        import sys
        import torch.distributed.tensor
        from torch.distributed.tensor import _api, _dispatch, _redistribute  # noqa: F401

        NAMES = {MOVE_NAMES!r}

        def bindings():
            out = {{}}
            for name, mod in list(sys.modules.items()):
                if not name.startswith("torch.distributed.tensor") or mod is None:
                    continue
                for attr, value in list(vars(mod).items()):
                    if attr in NAMES:
                        out[(name, attr)] = value
                    elif isinstance(value, type) and value.__module__.startswith("torch.distributed.tensor"):
                        for n in NAMES:
                            if n in vars(value):
                                out[(name, f"{{attr}}.{{n}}")] = vars(value)[n]
            return out

        before = bindings()
        assert {{("torch.distributed.tensor._api", "redistribute_local_tensor"),
                 ("torch.distributed.tensor._dispatch", "redistribute_local_tensor"),
                 ("torch.distributed.tensor._redistribute", "redistribute_local_tensor"),
                 ("torch.distributed.tensor", "distribute_tensor"), ("torch.distributed.tensor._api", "distribute_tensor"),
                 ("torch.distributed.tensor", "DTensor.redistribute")}} <= set(before), sorted(before)
        import dtensor_rules
        after = bindings()
        changed = sorted(k for k in before if after[k] is not before[k])
        assert not changed, changed
        assert all(not getattr(v, "__module__", "").startswith("dtensor_rules") for v in after.values())
        print("OK")
    """))

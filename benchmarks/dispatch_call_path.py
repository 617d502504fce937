"""The call path of a first ``torch.cumsum`` on a Shard(0) DTensor: how many layers of this package
sit between DTensor and the rule, how many calls go into package code, and how often control
switches between package modules (#21.1).

A 2x2 mesh on the ``fake`` process group (no rank runs; cumsum along dim 1 of a Shard(0) tensor
needs no collective). DTensor's sharding caches are cleared first, so the call is a cache miss:
everything DTensor asks of the package on a miss is counted. The profiler (``sys.setprofile``)
sees every Python call; a call counts as "into the package" when its code lives under
``src/dtensor_rules``; a "module switch" is such a call whose module differs from the module of
the nearest package frame below it (the package caller), i.e. control crossing a file boundary
inside the package. "Layers" are the package frames on the stack when the rule itself is entered.

    python benchmarks/dispatch_call_path.py          # layers / calls / modules, then the layer chain
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import FrameType
from typing import Any, NamedTuple

import torch
from torch.distributed.tensor import DTensor, Shard

import dtensor_rules
from dtensor_rules._upstream import clear_sharding_caches
from dtensor_rules.testing import fake_world

PACKAGE = str(Path(dtensor_rules.__file__).resolve().parent)


class CallPath(NamedTuple):
    layers: list[str]  # package frames (module:function) on the stack when the rule is entered, outermost first
    calls: int  # calls into package code
    switches: int  # package-to-package calls crossing a module boundary
    modules: list[str]  # package modules entered, in first-entry order


def _module(frame: FrameType) -> str | None:
    name = frame.f_code.co_filename
    if not name.startswith(PACKAGE):
        return None
    return name[len(PACKAGE) + 1 :].removesuffix(".py").replace("/", ".")


def measure(mesh_shape: tuple[int, ...] = (2, 2)) -> CallPath:
    from dtensor_rules.op_rules.scan import cumsum_strategy  # the rule (single-dim rows)

    rule_code = getattr(cumsum_strategy, "__wrapped__", cumsum_strategy).__code__
    with fake_world(mesh_shape[0] * mesh_shape[1]):
        mesh = torch.distributed.device_mesh.init_device_mesh("cpu", mesh_shape)
        x = DTensor.from_local(torch.randn(4, 8), mesh, [Shard(0), Shard(0)], run_check=False)
        torch.cumsum(x, 1)  # first-use costs (imports, fake-mode setup) are not the path
        clear_sharding_caches()
        calls = switches = 0
        modules: list[str] = []
        layers: list[str] = []

        def profile(frame: FrameType, event: str, arg: Any) -> None:
            nonlocal calls, switches, layers
            if event != "call":
                return
            mod = _module(frame)
            if mod is None:
                return
            calls += 1
            if mod not in modules:
                modules.append(mod)
            caller = frame.f_back
            while caller is not None and _module(caller) is None:
                caller = caller.f_back
            if caller is not None and _module(caller) != mod:
                switches += 1
            if frame.f_code is rule_code and not layers:
                stack = []
                f = frame.f_back
                while f is not None:
                    m = _module(f)
                    if m is not None:
                        stack.append(f"{m}:{f.f_code.co_name}")
                    f = f.f_back
                layers = stack[::-1]

        sys.setprofile(profile)
        try:
            torch.cumsum(x, 1)
        finally:
            sys.setprofile(None)
    return CallPath(layers, calls, switches, modules)


def main() -> int:
    dtensor_rules.install()
    path = measure()
    print(f"layers {len(path.layers)}  calls {path.calls}  module switches {path.switches}  modules {len(path.modules)}")
    for i, layer in enumerate(path.layers, 1):
        print(f"  {i}. {layer}")
    print("  -> ops.scan:cumsum_strategy (the rule)")
    print("modules: " + ", ".join(path.modules))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Only ``src/dtensor_rules/_upstream/`` may touch PyTorch's private distributed internals.

Everything else (the benchmarks included) goes through the adapter, so a torch release that renames a private symbol
breaks one shim (and one contract test), not modules all over the package. One test over every
module; its failure names each offending module and line, and the adapter to use instead.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "dtensor_rules"
ADAPTER = PACKAGE / "_upstream"
# private modules outside torch.distributed that we also keep behind the adapter
PRIVATE_MODULES = ("torch._meta_registrations", "torch._inductor", "torch._subclasses", "torch._prims")
# private attributes of upstream objects (DTensor, DeviceMesh, placements, the dispatcher)
PRIVATE_ATTRS = {
    "_spec", "_local_tensor", "_op_dispatcher", "_custom_op_handlers", "_sym_get_coordinate",
    "_to_replicate_tensor", "_to_new_shard_dim", "_replicate_to_shard", "_reduce_value",
    "_reduce_shard_value", "_partition_value", "_propagate_tensor_meta_cached",
    "_propagate_tensor_meta_non_cached", "_dispatch_get_local_results_slow_path",
    "_create_write_items_for_dtensor", "_create_chunk_from_dtensor", "_mesh_resources",
}


def _is_private_module(name: str) -> bool:
    parts = name.split(".")
    if parts[:2] == ["torch", "distributed"] and any(p.startswith("_") for p in parts[2:]):
        return True
    return name.startswith(PRIVATE_MODULES)


def violations(path: Path) -> list[str]:
    """``line: what`` for each private upstream access in one source file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [f"{node.lineno}: import {a.name}" for a in node.names if _is_private_module(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if _is_private_module(node.module):
                found.append(f"{node.lineno}: from {node.module} import ...")
            elif node.module.startswith("torch.distributed"):
                found += [f"{node.lineno}: from {node.module} import {a.name}" for a in node.names if a.name.startswith("_")]
        elif isinstance(node, ast.Attribute) and node.attr in PRIVATE_ATTRS:
            found.append(f"{node.lineno}: .{node.attr}")
    return found


MODULES = sorted(p for p in PACKAGE.rglob("*.py") if ADAPTER not in p.parents)
# benchmarks compare against upstream's private code: they too reach it through the adapter
BENCHMARKS = PACKAGE.parent.parent / "benchmarks"
MODULES += sorted(BENCHMARKS.glob("*.py"))


def test_no_private_upstream_access_outside_adapter() -> None:
    assert len(MODULES) > 50 and BENCHMARKS / "propagation_cost.py" in MODULES  # the package and the benchmarks
    bad = {p.relative_to(PACKAGE.parent): v for p in MODULES if (v := violations(p))}
    assert not bad, (
        "modules reaching private torch internals directly:\n"
        + "\n".join(f"  {path}:\n    " + "\n    ".join(lines) for path, lines in bad.items())
        + "\nGo through dtensor_rules._upstream (add a shim there if it lacks one)."
    )


def test_the_checker_catches_each_kind_of_access(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text(
        "import torch.distributed._functional_collectives as f\n"
        "from torch.distributed.tensor._op_schema import OpSchema\n"
        "from torch.distributed.tensor.placement_types import _StridedShard\n"
        "from torch._meta_registrations import x\n"
        "y = dt._local_tensor\n"
        "from torch.distributed.tensor import DTensor, Shard\n"  # public: fine
    )
    assert [v.split(":")[0] for v in violations(src)] == ["1", "2", "3", "4", "5"]

"""Command line: ``python -m dtensor_rules {demo,validate,status,coverage}``.

The parser is built without importing torch, so ``--help`` and typos answer at once; torch
and the rules load (``dtensor_rules.load()``) only inside the chosen command.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence

HARDWARE = ("h100", "h200", "a100", "b200", "cpu")  # dtensor_rules.costs profiles (tests/test_cli.py checks the list)
# every command runs all ranks of its mesh in this one process (simulated or fake), and validate's
# work grows with the rank count times the layouts per mesh dim: 16 ranks (4x4, 2x2x4) stays minutes
MAX_RANKS = 16


def parse_mesh(text: str) -> tuple[int, ...]:
    """'2' -> (2,), '2x2' -> (2, 2), '2x2x2' -> (2, 2, 2); at most 3 dims and MAX_RANKS ranks."""
    try:
        shape = tuple(int(p) for p in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"mesh must look like 2, 2x2 or 2x2x2, got {text!r}") from None
    if not 1 <= len(shape) <= 3 or any(s < 1 for s in shape):
        raise argparse.ArgumentTypeError(f"mesh must have 1 to 3 positive dims, got {text!r}")
    ranks = math.prod(shape)
    if ranks > MAX_RANKS:
        raise argparse.ArgumentTypeError(
            f"mesh must have at most {MAX_RANKS} ranks (every rank runs in this one process), "
            f"got {text!r} = {ranks} ranks; use e.g. 4x4 or 2x2x4")
    return shape


DESCRIPTIONS = {
    "demo": "Run the DeepSeekV3-style MoE block on a simulated ('ep', 'tp') mesh, every rank in this "
            "process: op coverage, sharded = single device (fp32 and bf16, output and all gradients), a "
            "planned redistribute, per-op costs, and expert parallelism next to the gather path. "
            "Exit status 0 when every check holds.",
    "validate": "Check our sharding rule and upstream's for one op against ground truth: every layout "
                "a rule offers is run on a simulated mesh and compared with plain torch on the full tensor "
                "(correct or incorrect), and every valid layout a rule does not offer is its missing one "
                "(-v lists ours, each with why). A rule of your own is checked on its samples= after "
                "--import MODULE loads the module that registers it. "
                "Exit status 1 if our rule offers an incorrect layout.",
    "status": "List every op this package has a rule for: whether upstream has one too, which one is "
              "active in DTensor's dispatch, and why (the install policy's measured comparison); then every named patch (docs/patches.md) "
              "with its default, state and reason.",
    "coverage": "Trace the demo's MoE block forward+backward (make_fx) and list, per op, where its sharding "
                "rule comes from (ours, upstream, decomposition, handler), how many strategies it offers on "
                "the mesh, and its cost on the chosen hardware. Exit status 1 if an op has no rule.",
}


def _load() -> None:
    import dtensor_rules

    dtensor_rules.load()


def _import_user_modules(names: Sequence[str]) -> str | None:
    """Import each ``--import`` target (a module name or a .py file): its ``register(...)`` calls
    add the user's rules. Returns an error line, or None."""
    import importlib
    import importlib.util
    import os

    if os.getcwd() not in sys.path and "" not in sys.path:  # as `python -m` does: the user's folder is importable
        sys.path.append(os.getcwd())
    for name in names:
        try:
            if name.endswith(".py"):
                spec = importlib.util.spec_from_file_location(os.path.basename(name)[:-3], name)
                if spec is None or spec.loader is None or not os.path.isfile(name):
                    return f"--import {name}: no such file"
                module = importlib.util.module_from_spec(spec)
                sys.modules[spec.name] = module
                spec.loader.exec_module(module)
            else:
                importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name is not None and name.split(".")[0] == e.name.split(".")[0]:
                return (f"--import {name}: no module named {e.name!r}; run from the folder that holds it "
                        "or add that folder to PYTHONPATH (a file path such as rules/mine.py works too)")
            raise
    return None


def _validate(args: argparse.Namespace) -> int:
    from dtensor_rules.cli.op_names import is_shipped_name, unknown_op_message

    imports = args.imports or []
    if not imports and not is_shipped_name(args.op):  # a typo: answered before torch loads
        from dtensor_rules.cli.shipped_op_names import SHIPPED_OP_NAMES

        print(f"error: {unknown_op_message(args.op, SHIPPED_OP_NAMES)}", file=sys.stderr)
        return 2
    _load()
    from dtensor_rules import registry
    from dtensor_rules.cli.op_names import accepted_names
    from dtensor_rules.cli.resolve import resolve
    from dtensor_rules.testing import check_samples

    failed = _import_user_modules(imports)
    if failed:
        print(f"error: {failed}", file=sys.stderr)
        return 2
    try:
        op, samples, _how = resolve(args.op)  # every shipped rule: own suite, deferred op, out=/in-place variants
    except KeyError as e:
        message = e.args[0]
        if message.startswith("unknown op"):
            message = unknown_op_message(args.op, accepted_names(), imports)
        print(f"error: {message}", file=sys.stderr)
        return 2
    report = check_samples(op, samples, args.mesh, progress=not args.json)
    if args.json:  # stdout is exactly one JSON document
        print(json.dumps(report.to_json()))
    else:
        print(report.summary())
        if report.valid == 0:  # "incorrect 0, missing 0" would hold for any rule that offers nothing
            print(f"  note: no sharded layout is valid on these samples ({report.tried} tried): the op is "
                  "Replicate-only here, and the counts above say only that a rule offers no sharded layout")
        if args.verbose:
            for c, why in zip(report.ours.missing_combos, report.ours.missing_reasons):
                print(f"    ours missing: {c}  ({why})")
            if report.ours.missing_combos:
                rule = registry.get_rule(op)
                print(f"    (which layouts the rule offers and why: its strategy table, "
                      f"dtensor_rules.get_rule({str(op)!r}).doc, in {rule.module or 'its module'})")
    return 1 if report.ours.incorrect else 0


def _status(args: argparse.Namespace) -> int:
    _load()
    import dtensor_rules

    status = dtensor_rules.status()
    rows = sorted(((str(op), s["has"], s["active"], s["why"]) for op, s in status.items()))
    rows += sorted((name, "ours", "not yet", why) for name, why in status.deferred.items())
    print(f"{'op':45s} {'rules':8s} {'active':9s} why")
    for op, has, active, why in rows:
        print(f"{op:45s} {has:8s} {active:9s} {why}")
    print(f"\n{'patch (docs/patches.md)':25s} {'default':8s} state / why / upstream gap")
    for p in status.patches.values():
        print(f"{p.name:25s} {'on' if p.default else 'off':8s} {p.state}\n{'':34s} why: {p.reason}\n"
              f"{'':34s} upstream: {p.upstream}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    _load()
    from dtensor_rules.cli.demo import run_demo

    return run_demo(args.mesh)


def _coverage(args: argparse.Namespace) -> int:
    _load()
    from dtensor_rules.cli.coverage import coverage_main

    return coverage_main(["--mesh", "x".join(map(str, args.mesh)), "--hardware", args.hardware])


def build_parser() -> argparse.ArgumentParser:
    """The whole CLI (no torch import: ``--help`` and typos stay instant)."""
    parser = argparse.ArgumentParser(prog="python -m dtensor_rules", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="{demo,validate,status,coverage}")
    p = sub.add_parser("demo", help="run the MoE demo on a simulated mesh (about a minute)", description=DESCRIPTIONS["demo"])
    p.add_argument("--mesh", type=parse_mesh, default=(2, 2), help="2-D ('ep', 'tp') mesh, default 2x2")
    p.set_defaults(fn=_demo)
    p = sub.add_parser("validate", help="validate ours vs upstream's rule for an op against ground truth",
                       description=DESCRIPTIONS["validate"])
    p.add_argument("--op", required=True, help="e.g. fma, cumsum, moe_permute_indices, aten._softmax_backward_data.default, "
                   "or a rule of your own (with --import)")
    p.add_argument("--import", dest="imports", action="append", metavar="MODULE",
                   help="import MODULE (a module name, e.g. mypkg.rules, or a .py file) first, so the rules its "
                        "register(...) calls define can be validated; repeatable")
    p.add_argument("--mesh", type=parse_mesh, default=(2,), help=f"2, 2x2 or 2x2x2 (at most {MAX_RANKS} ranks)")
    p.add_argument("--json", action="store_true", help="print only one JSON document on stdout")
    p.add_argument("-v", "--verbose", action="store_true", help="list the layouts our rule misses, each with why")
    p.set_defaults(fn=_validate)
    p = sub.add_parser("status", help="which ops have our rule, upstream's, and which is active; the named patches",
                       description=DESCRIPTIONS["status"])
    p.set_defaults(fn=_status)
    p = sub.add_parser("coverage", help="trace the demo's MoE block and list each op's rule source and cost",
                       description=DESCRIPTIONS["coverage"])
    p.add_argument("--mesh", type=parse_mesh, default=(2, 2), help=f"mesh shape, e.g. 2x2 (at most {MAX_RANKS} ranks)")
    p.add_argument("--hardware", choices=HARDWARE, default="h100", help="cost model profile for the cost column")
    p.set_defaults(fn=_coverage)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())

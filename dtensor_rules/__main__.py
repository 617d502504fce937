"""Command line: ``python -m dtensor_rules {demo,validate,status,coverage}``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence


def parse_mesh(text: str) -> tuple[int, ...]:
    """'2' -> (2,), '2x2' -> (2, 2), '2x2x2' -> (2, 2, 2)."""
    try:
        shape = tuple(int(p) for p in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"mesh must look like 2, 2x2 or 2x2x2, got {text!r}") from None
    if not 1 <= len(shape) <= 3 or any(s < 1 for s in shape):
        raise argparse.ArgumentTypeError(f"mesh must have 1 to 3 positive dims, got {text!r}")
    return shape


def _validate(args: argparse.Namespace) -> int:
    from dtensor_rules import registry
    from dtensor_rules.testing import check_samples
    from dtensor_rules.testing.suites import find_op

    try:
        op = find_op(args.op)
    except KeyError as e:
        print(f"error: {e.args[0]}", file=sys.stderr)
        return 2
    samples = registry.get_rule(op).samples  # find_op resolves only ops whose rule names samples
    report = check_samples(op, list(samples()), args.mesh, progress=not args.json)
    print(report.summary())
    if args.verbose:
        for c in report.ours.missing_combos:
            print(f"    ours missing: {c}")
    if args.json:
        print(json.dumps(report.to_json()))
    return 1 if report.ours.incorrect else 0


def _status(args: argparse.Namespace) -> int:
    import dtensor_rules

    rows = sorted(((str(op), s["has"], s["active"]) for op, s in dtensor_rules.status().items()))
    print(f"{'op':45s} {'rules':8s} active")
    for op, has, active in rows:
        print(f"{op:45s} {has:8s} {active}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from dtensor_rules.demo import run_demo

    return run_demo(args.mesh)


def _coverage(args: argparse.Namespace) -> int:
    try:
        from dtensor_rules.coverage import coverage_main
    except ImportError:
        print("error: the coverage tool is not available in this build", file=sys.stderr)
        return 2
    return coverage_main(["--mesh", "x".join(map(str, args.mesh))])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dtensor_rules", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="run the demo on a simulated mesh")
    p.add_argument("--mesh", type=parse_mesh, default=(2, 2))
    p.set_defaults(fn=_demo)
    p = sub.add_parser("validate", help="validate ours vs upstream's rule for an op against ground truth")
    p.add_argument("--op", required=True, help="e.g. fma, cumsum, aten._softmax_backward_data.default")
    p.add_argument("--mesh", type=parse_mesh, default=(2,), help="2, 2x2 or 2x2x2")
    p.add_argument("--json", action="store_true", help="last line of stdout is one JSON object")
    p.add_argument("-v", "--verbose", action="store_true", help="list the combos our rule misses")
    p.set_defaults(fn=_validate)
    p = sub.add_parser("status", help="which ops have our rule, upstream's, and which is active")
    p.set_defaults(fn=_status)
    p = sub.add_parser("coverage", help="trace the MoE block and list each op's rule source")
    p.add_argument("--mesh", type=parse_mesh, default=(2, 2))
    p.set_defaults(fn=_coverage)
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())

"""Ours vs upstream torch's sharding rules on the fixed sample suites, same run, same samples.

For every op with a sample suite (dtensor_rules/testing/suites), validates both sides against
ground truth (per-rank simulation) and prints correct / incorrect / missing per op and in total.

    python benchmarks/rule_coverage.py                 # meshes 2 and 2x2
    python benchmarks/rule_coverage.py --mesh 2 --mesh 4 --op cumsum
"""

from __future__ import annotations

import argparse
import sys
import time

import dtensor_rules  # noqa: F401  (installs our rules; upstream's stay queryable)
from dtensor_rules.__main__ import parse_mesh
from dtensor_rules.testing import check_samples
from dtensor_rules.testing.suites import find_op, samples_for, suites


def cell(side) -> str:
    if not side.has_rule:
        return f"{'no rule':>14s} {side.missing:>5d}"
    return f"{side.correct:>5d} {side.incorrect:>4d} {side.missing:>4d} {'' if not side.error else '!':1s}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mesh", type=parse_mesh, action="append", help="repeatable; default 2 and 2x2")
    parser.add_argument("--op", action="append", help="restrict to these ops (repeatable)")
    args = parser.parse_args(argv)
    meshes = args.mesh or [(2,), (2, 2)]
    ops = [find_op(o) for o in args.op] if args.op else sorted(suites(), key=str)
    worst = 0
    for mesh in meshes:
        m = "x".join(map(str, mesh))
        print(f"\n### mesh {m}  (correct / incorrect / missing; '!' = the rule raised on a sample)\n")
        print(f"| {'op':40s} | {'ours c    i    m':16s} | {'upstream c   i    m':20s} | valid |")
        print(f"|{'-' * 42}|{'-' * 18}|{'-' * 22}|-------|")
        tot = {"ours": [0, 0, 0], "upstream": [0, 0, 0], "valid": 0}
        start = time.perf_counter()
        for op in ops:
            r = check_samples(op, samples_for(op), mesh)
            print(f"| {str(op):40s} | {cell(r.ours):16s} | {cell(r.upstream):20s} | {r.valid:5d} |")
            for name, side in (("ours", r.ours), ("upstream", r.upstream)):
                t = tot[name]
                t[0], t[1], t[2] = t[0] + side.correct, t[1] + side.incorrect, t[2] + side.missing
            tot["valid"] += r.valid
            if r.ours.incorrect or r.ours.correct < r.upstream.correct:
                worst = 1
        o, u = tot["ours"], tot["upstream"]
        print(f"| {'TOTAL':40s} | {o[0]:>5d} {o[1]:>4d} {o[2]:>4d}  | {u[0]:>9d} {u[1]:>4d} {u[2]:>4d}  | {tot['valid']:5d} |")
        print(f"\n({time.perf_counter() - start:.1f}s)")
    return worst


if __name__ == "__main__":
    sys.exit(main())

"""Ours vs upstream torch's sharding rules on the fixed sample suites, same run, same samples.

For every op with a sample suite (beside its rule in src/dtensor_rules/op_rules), validates both sides against
ground truth (per-rank simulation) and prints correct / incorrect / missing per op and in total,
labelled with the running torch version.

    python benchmarks/rule_coverage.py                 # meshes 2 and 2x2
    python benchmarks/rule_coverage.py --mesh 2 --mesh 4 --op cumsum
    python benchmarks/rule_coverage.py --write-measured
        # the one regeneration command (run it with each tested torch release): mesh 2, every
        # overload (out=/in-place too) both sides have a rule for on this torch; writes
        # src/dtensor_rules/_upstream/measured_<major>_<minor>.json, the data install() decides from
    python benchmarks/rule_coverage.py --side-by-side  # both checked-in measured files, one table

Exit status 1 if ours is incorrect anywhere, or has fewer correct layouts than an upstream rule
that is never incorrect on an op (correctness first, as install() decides).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import torch

import dtensor_rules  # noqa: F401  (registers our rules; upstream's stay queryable)
from dtensor_rules.cli.main import parse_mesh
from dtensor_rules._upstream import TESTED_TORCH
from dtensor_rules._upstream.measured import MEASURED_MESHES, REGENERATE, decide, load
from dtensor_rules.testing import measure
from dtensor_rules.testing.suites import find_op, suites


def cell(side: dict[str, int] | None, valid: int) -> str:
    if side is None:
        return f"{'no rule':>14s} {valid:>5d}"
    return f"{side['correct']:>5d} {side['incorrect']:>4d} {side['missing']:>4d}"


def print_tables(doc: dict[str, Any]) -> int:
    worst = 0
    for m in doc["meshes"]:
        print(f"\n### torch {doc['torch']}, mesh {m}  (correct / incorrect / missing)\n")
        print(f"| {'op':40s} | {'ours c    i    m':16s} | {'upstream c   i    m':20s} | valid |")
        print(f"|{'-' * 42}|{'-' * 18}|{'-' * 22}|-------|")
        tot = {"ours": [0, 0, 0], "upstream": [0, 0, 0], "valid": 0}
        for op, record in doc["ops"].items():
            r = record[m]
            print(f"| {op:40s} | {cell(r['ours'], r['valid']):16s} | {cell(r['upstream'], r['valid']):20s} | {r['valid']:5d} |")
            for name in ("ours", "upstream"):
                side = r[name] or {"correct": 0, "incorrect": 0, "missing": r["valid"]}
                tot[name] = [a + side[k] for a, k in zip(tot[name], ("correct", "incorrect", "missing"))]
            tot["valid"] += r["valid"]
            up = r["upstream"] or {"correct": 0, "incorrect": 0}
            if r["ours"]["incorrect"] or (r["ours"]["correct"] < up["correct"] and not up["incorrect"]):
                worst = 1
        o, u = tot["ours"], tot["upstream"]
        print(f"| {'TOTAL':40s} | {o[0]:>5d} {o[1]:>4d} {o[2]:>4d}  | {u[0]:>9d} {u[1]:>4d} {u[2]:>4d}  | {tot['valid']:5d} |")
    return worst


def side_by_side() -> int:
    """One row per op: upstream's counts and install()'s verdict on every measured torch release."""
    docs = {v: load(v) for v in TESTED_TORCH}
    missing = [f"{v[0]}.{v[1]}" for v, d in docs.items() if d is None]
    if missing:
        print(f"no measured file for torch {', '.join(missing)}: run `{REGENERATE}` with it", file=sys.stderr)
        return 2
    labels = [f"{v[0]}.{v[1]}" for v in docs]
    ops = sorted({op for d in docs.values() for op in d["ops"]})
    meshes = next(iter(docs.values()))["meshes"]
    print(f"Summed over meshes {', '.join(meshes)}: correct / incorrect; 'no rule': upstream had none on "
          "that release (only ops both sides have a rule for are measured); kept = the rule install() keeps\n")
    head = " | ".join(f"ours {x} | upstream {x} | kept {x}" for x in labels)
    print(f"| op | {head} |")
    print("|---|" + "---|---|---|" * len(labels))
    for op in ops:
        cells = []
        for d in docs.values():
            record = d["ops"].get(op)
            if record is None:  # the files hold contested ops only: upstream had no rule there
                cells += ["not measured", "no rule", "ours"]
                continue
            sides = []
            for name in ("ours", "upstream"):
                per = [record[m][name] for m in meshes]
                sides.append("-" if any(p is None for p in per) else
                             f"{sum(p['correct'] for p in per)} / {sum(p['incorrect'] for p in per)}")
            v = decide(record) if sides[1] != "-" else None
            cells += sides + ["ours" if v is None else v.keep]
        print(f"| {op} | " + " | ".join(cells) + " |")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mesh", type=parse_mesh, action="append", help="repeatable; default 2 and 2x2")
    parser.add_argument("--op", action="append", help="restrict to these ops (repeatable)")
    parser.add_argument("--variants", action="store_true",
                        help="also our out= / in-place overloads, on their functional counterpart's suite")
    parser.add_argument("--write-measured", action="store_true",
                        help="regenerate the running torch's src/dtensor_rules/_upstream/measured_<ver>.json "
                             "(implies --mesh 2 --variants --contested; takes no --op or --mesh)")
    parser.add_argument("--contested", action="store_true",
                        help="only ops upstream also has a rule for on this torch (what install() decides on)")
    parser.add_argument("--side-by-side", action="store_true", help="print the checked-in measured files side by side")
    args = parser.parse_args(argv)
    if args.side_by_side:
        return side_by_side()
    if args.write_measured:  # always the whole file, the same way: install() decides from it
        if args.op or args.mesh:
            parser.error(f"--write-measured regenerates the whole file: run `{REGENERATE}` without --op/--mesh")
        args.mesh, args.variants, args.contested = [tuple(m) for m in MEASURED_MESHES], True, True
    meshes = args.mesh or [(2,), (2, 2)]
    if args.op:
        ops = [find_op(o) for o in args.op]
    elif args.variants:
        ops = measure.measured_ops()
    else:
        ops = sorted(suites(), key=str)
    if args.contested:
        ops = [op for op in ops if dtensor_rules.status()[op]["has"] == "both"]
    start = time.perf_counter()
    command = "python benchmarks/rule_coverage.py " + " ".join(argv if argv is not None else sys.argv[1:])
    doc = measure.measure(ops, meshes, REGENERATE if args.write_measured else command.strip())
    worst = print_tables(doc)
    print(f"\n(torch {torch.__version__}: {time.perf_counter() - start:.1f}s)")
    if args.write_measured:
        print(f"wrote {measure.write(doc)}")
    return worst


if __name__ == "__main__":
    sys.exit(main())

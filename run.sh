#!/usr/bin/env bash
# One entry point that needs nothing pre-installed but Python 3.10+:
#   ./run.sh demo   -- the MoE demo on a simulated 2x2 mesh
#   ./run.sh test   -- the test suite
# It creates .venv (once), installs the package with its extras (EXTRAS, default "test";
# CI uses "test,triton") and torch pinned by constraints.txt (the CPU build), then runs the command.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
EXTRAS=${EXTRAS:-test}
stamp=.venv/.installed-$( (cat setup.py constraints.txt; echo "$EXTRAS") | cksum | cut -d' ' -f1)
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install -q --disable-pip-version-check -c constraints.txt -e ".[$EXTRAS]"
  touch "$stamp"
fi
cmd=${1:-}
shift || true
case "$cmd" in
  demo) exec .venv/bin/python -m dtensor_rules demo "$@" ;;
  test) exec .venv/bin/python -m pytest -n 2 -q "$@" ;;
  *) exec .venv/bin/python -m dtensor_rules "$cmd" "$@" ;;
esac

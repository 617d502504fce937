#!/usr/bin/env bash
# One entry point that needs nothing pre-installed but Python 3.10+:
#   ./run.sh demo   -- the MoE demo on a simulated 2x2 mesh
#   ./run.sh test   -- the test suite
# It creates .venv (once), installs the package with its extras (EXTRAS; default "test" for
# the tests, none for the demo; CI uses "test,triton") and torch pinned by constraints.txt
# (the CPU build), then runs the command.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
cmd=${1:-}
# the demo needs only the package; tests need the [test] extras
[ "$cmd" = test ] && default_extras=test || default_extras=
EXTRAS=${EXTRAS-$default_extras}
hash=$( (cat setup.py constraints.txt) | cksum | cut -d' ' -f1)
want=$(echo "$EXTRAS" | tr ',' '\n' | sed '/^$/d' | sort -u)
have=$(cat ".venv/.installed-$hash" 2>/dev/null || echo missing)
if [ "$have" = missing ] || [ -n "$(comm -23 <(echo "$want") <(echo "$have"))" ]; then
  spec=.
  [ -n "$EXTRAS" ] && spec=".[$EXTRAS]"
  # (the grep drops pip's notes about this machine's unused local index folders)
  .venv/bin/python -m pip install -q --disable-pip-version-check -c constraints.txt -e "$spec" \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
  { [ "$have" = missing ] || echo "$have"; echo "$want"; } | sed '/^$/d' | sort -u > ".venv/.installed-$hash"
fi
shift || true
case "$cmd" in
  demo) exec .venv/bin/python -m dtensor_rules demo "$@" ;;
  test) exec .venv/bin/python -m pytest -n 2 -q "$@" ;;
  *) exec .venv/bin/python -m dtensor_rules "$cmd" "$@" ;;
esac

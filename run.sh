#!/usr/bin/env bash
# One entry point that needs nothing pre-installed but Python 3.10+:
#   ./run.sh demo   -- the MoE demo on a simulated 2x2 mesh
#   ./run.sh test   -- the test suite
# It creates .venv (once), installs the package with its extras (EXTRAS; for `test` the default is
# CI's "test,triton,solver,torchtitan", so the suite runs what CI runs; none for the other commands)
# and torch pinned by constraints.txt (2.13.0: pip takes a 2.13.0+cpu wheel where one is visible to it,
# else the registry's 2.13.0, which on Linux x86_64 is the CUDA build; README.md, "What gets installed"),
# then runs the command. EXTRAS=test ./run.sh test installs less, and the tests of the missing extras skip.
# TORCH_VERSION=2.14.1 ./run.sh test  -- the same in .venv-2.14.1, torch pinned by
# constraints-2.14.txt (the registry's CUDA build, ~5.5 GB; it runs on CPU).
set -euo pipefail
cd "$(dirname "$0")"
usage() {
  cat <<'EOF'
usage: ./run.sh COMMAND [ARGS...]

  demo [--mesh 2x2]                 the MoE demo on a simulated mesh (about a minute)
  test [PYTEST ARGS...]             the test suite (pytest -n 2)
  validate --op OP [--mesh 2x2] [--json] [--import MODULE]
                                    check ours vs upstream's rule for OP against ground truth
                                    (--import: the module that registers a rule of yours)
  status                            which ops have our rule, upstream's, and which is active
  coverage [--mesh 2x2] [--hardware h100]
                                    each op of the demo's MoE block: rule source and cost

./run.sh COMMAND --help explains a command. The first run creates .venv and installs
the package and torch 2.13.0 there (test: with CI's extras test,triton,solver,torchtitan);
EXTRAS=... ./run.sh ... chooses the extras.
EOF
}
cmd=${1:-}
case "$cmd" in
  ""|-h|--help|help) usage; exit 0 ;;  # answered before any install
  demo|test|validate|status|coverage) ;;
  *) usage >&2; echo "run.sh: error: unknown command '$cmd'" >&2; exit 2 ;;
esac
PY=${PYTHON:-python3}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
case "$TORCH_VERSION" in
  2.13.0) VENV=.venv CONSTRAINTS=constraints.txt ;;
  2.14.1) VENV=.venv-2.14.1 CONSTRAINTS=constraints-2.14.txt ;;
  *) echo "run.sh: TORCH_VERSION=$TORCH_VERSION is not a tested release (tested: 2.13.0, 2.14.1)" >&2; exit 2 ;;
esac
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
# the demo needs only the package; the tests get CI's extras, so that none of them skips
[ "$cmd" = test ] && default_extras=test,triton,solver,torchtitan || default_extras=
EXTRAS=${EXTRAS-$default_extras}
hash=$( (cat setup.py "$CONSTRAINTS") | cksum | cut -d' ' -f1)
want=$(echo "$EXTRAS" | tr ',' '\n' | sed '/^$/d' | sort -u)
have=$(cat "$VENV/.installed-$hash" 2>/dev/null || echo missing)
if [ "$have" = missing ] || [ -n "$(comm -23 <(echo "$want") <(echo "$have"))" ]; then
  spec=.
  [ -n "$EXTRAS" ] && spec=".[$EXTRAS]"
  torch_pin=$(sed -n 's/^torch==//p' "$CONSTRAINTS" | head -n 1)
  if [ "$have" = missing ]; then
    echo "run.sh: installing dtensor_rules${EXTRAS:+[$EXTRAS]} with torch ${torch_pin:-$TORCH_VERSION} into $VENV (first run, about 2-3 minutes)..." >&2
  else
    echo "run.sh: adding extras [$EXTRAS] to $VENV..." >&2
  fi
  # (the grep drops pip's notes about this machine's unused local index folders)
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -c "$CONSTRAINTS" -e "$spec" \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
  { [ "$have" = missing ] || echo "$have"; echo "$want"; } | sed '/^$/d' | sort -u > "$VENV/.installed-$hash"
fi
shift || true
case "$cmd" in
  demo) exec "$VENV/bin/python" -m dtensor_rules demo "$@" ;;
  # the README's test command is deterministic (the derandomized `ci` profile, as CI runs it);
  # HYPOTHESIS_PROFILE=dev explores new random inputs (tests/conftest.py)
  test) HYPOTHESIS_PROFILE=${HYPOTHESIS_PROFILE:-ci} exec "$VENV/bin/python" -m pytest -n 2 -q "$@" ;;
  *) exec "$VENV/bin/python" -m dtensor_rules "$cmd" "$@" ;;
esac

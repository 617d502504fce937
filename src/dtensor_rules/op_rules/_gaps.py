"""Why a shipped rule names no ``cost`` or no ``samples``: the reasons op modules pass as ``register(gaps=...)``.

Every shipped rule has a cost formula and a sample suite or says here why not
(``tests/test_contract.py`` checks it).
"""

ALIASED_SAMPLES = (
    "out=/in-place overload: no suite of its own; tests/test_rules_aliasing.py validates it on aliased copies "
    "of its functional overload's samples"
)
NO_FORMULA = "no cost formula of its own (estimate falls back to the generic families or raises CostError)"
ALIASED_UNPRICED = f"{ALIASED_SAMPLES}; {NO_FORMULA}"
HACKED_TWIN = (
    "hacked_twin: torch's internal copy of the overload with non-optional indices; no suite of its own "
    f"(the suites pass None indices); {NO_FORMULA}"
)
VIEW = "a view: no formula of its own, the generic 'view' family prices it (free)"
COLLECTIVE = (
    "a collective over a process group named in its arguments: the validator's simulated ranks have no such "
    "group, so tests/test_ep_compile.py checks the rule on real gloo ranks (DTensor on the tp mesh dim, the "
    "op's group the ep dim) against the op on the full tensor"
)

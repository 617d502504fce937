"""``python -m dtensor_rules``: the command line lives in :mod:`dtensor_rules.cli`."""

import sys

from dtensor_rules.cli.main import main

if __name__ == "__main__":
    sys.exit(main())

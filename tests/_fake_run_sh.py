"""run.sh's real logic in milliseconds: a copy of run.sh in a temporary folder with a fake python."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from tests._fresh import ROOT


def fake_run_sh(tmp_path: Path) -> tuple[dict, Path]:
    """run.sh, setup.py and the constraints in ``tmp_path`` with a fake python (venv, pip, pytest stand-ins)."""
    for name in ("run.sh", "setup.py", "constraints.txt", "constraints-2.14.txt"):
        shutil.copy(ROOT / name, tmp_path / name)
    fake = tmp_path / "fakepy"
    fake.write_text(
        "#!/bin/sh\n"
        'if [ "$1 $2" = "-m venv" ]; then mkdir -p "$3/bin" && cp "$0" "$3/bin/python"; exit 0; fi\n'
        'if [ "$1 $2" = "-m pip" ]; then echo "$*" >> "$(dirname "$0")/../pip.log"; exit 0; fi\n'
        'echo "ran $*"\n'
    )
    fake.chmod(0o755)
    env = {**os.environ, "PYTHON": str(fake)}
    for var in ("EXTRAS", "TORCH_VERSION", "HYPOTHESIS_PROFILE"):
        env.pop(var, None)
    return env, tmp_path / ".venv" / "pip.log"

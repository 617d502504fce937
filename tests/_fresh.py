"""Fresh Python processes for tests that need one, without paying ``import torch`` each time.

``run_python`` runs code (or ``-m module``) in a new process forked from the fork server that
``run_gloo`` uses, which has imported torch and ``torch.distributed.tensor`` and nothing of
dtensor_rules: the process starts with no module of the package loaded, so what an import of
dtensor_rules does (installs, patches, modules it loads) is seen from its start, as in
``python -c``. It gets the given environment, argv, working directory and stdout/stderr
files, and returns a ``subprocess.CompletedProcess``. Use a real ``subprocess`` only where the
interpreter's own start is under test (``-X importtime``, ``./run.sh``).

This module imports only the standard library at its top: the child imports it to find
``_child``, and must not load dtensor_rules before the code under test does.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _child(code: str | None, module: str | None, argv: list[str], env: dict[str, str], cwd: str,
           out_path: str, err_path: str) -> None:
    import runpy
    import traceback

    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    for fd, path in ((1, out_path), (2, err_path)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(target, fd)
        os.close(target)
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115  (the process's own stdout)
    sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
    sys.argv = argv
    status = 0
    try:
        if module is not None:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            exec(compile(code or "", "<string>", "exec"), {"__name__": "__main__"})  # noqa: S102
    except SystemExit as e:  # what the interpreter makes of sys.exit(code)
        if isinstance(e.code, int) or e.code is None:
            status = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            status = 1
    except BaseException:  # noqa: BLE001  (what the interpreter does with an uncaught exception)
        traceback.print_exc()
        status = 1
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        if stream is not None:
            stream.flush()
    os._exit(status & 0xFF)


def run_python(code: str | None = None, *, module: str | None = None, args: Sequence[str] = (),
               env: Mapping[str, str] | None = None, cwd: str | Path = ROOT, timeout: float = 600) -> subprocess.CompletedProcess:
    """Like ``subprocess.run([python, "-c", code] or [python, "-m", module, *args], capture_output=True,
    text=True)``, in a fresh process forked from the torch-preloaded server (see the module doc)."""
    if (code is None) == (module is None):
        raise ValueError("give code or module, not both")
    from dtensor_rules.testing.mesh import process_context

    ctx = process_context()
    argv = [module, *args] if module is not None else ["-c", *args]
    env = dict(os.environ if env is None else env)
    with tempfile.TemporaryDirectory(prefix="dtensor_rules_fresh_") as tmp:
        out, err = os.path.join(tmp, "out"), os.path.join(tmp, "err")
        proc = ctx.Process(target=_child, args=(code, module, argv, env, str(cwd), out, err))
        proc.start()
        proc.join(timeout)
        if proc.is_alive():
            proc.kill()
            proc.join()
            raise subprocess.TimeoutExpired(argv, timeout, Path(out).read_text(), Path(err).read_text())
        return subprocess.CompletedProcess(argv, proc.exitcode, Path(out).read_text(), Path(err).read_text())

"""Terminal helpers for the demo: aligned tables, section headers and a step progress bar.

Dependency-free on purpose (the demo must run from a fresh clone with only torch installed).
The bar draws on stderr only when stderr is a terminal, so piped/logged output stays clean.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import TextIO

__all__ = ["Steps", "header", "table"]


def header(title: str, out: TextIO) -> None:
    """``== title ======`` with a blank line before it."""
    print(f"\n== {title} " + "=" * max(3, 76 - len(title)), file=out)


def table(rows: Sequence[Sequence[object]], head: Sequence[str], right: Sequence[int] = ()) -> str:
    """Rows under ``head`` with a dashed rule; columns whose index is in ``right`` align right."""
    cells = [[str(c) for c in head], *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(head))]

    def line(r: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()

    return "\n".join([line(cells[0]), "  ".join("-" * w for w in widths), *map(line, cells[1:])])


class Steps:
    """A progress bar over named steps: ``with Steps("label", 3) as s: ...; s.step("next"); ...``.

    Drawn (on a terminal) after the first step starts; on exit it is replaced by one
    ``label: done in 1.2s`` line on ``out``, so logs show the timing of slow stages.
    """

    def __init__(self, label: str, total: int, out: TextIO, stream: TextIO | None = None) -> None:
        self.label, self.total, self.out = label, max(total, 1), out
        self.stream = stream if stream is not None else sys.stderr
        self.live = bool(getattr(self.stream, "isatty", lambda: False)())
        self.n = 0
        self.start = 0.0

    def __enter__(self) -> "Steps":
        self.start = time.perf_counter()
        return self

    def step(self, what: str) -> None:
        """Mark the start of step ``what`` (the bar shows steps already finished)."""
        if self.live:
            filled = 24 * self.n // self.total
            elapsed = time.perf_counter() - self.start
            self.stream.write(
                f"\r\033[K{self.label} [{'#' * filled}{'.' * (24 - filled)}] {self.n}/{self.total} {elapsed:4.1f}s {what}"
            )
            self.stream.flush()
        self.n += 1

    def __exit__(self, *exc: object) -> None:
        if self.live:
            self.stream.write("\r\033[K")
            self.stream.flush()
        if exc[0] is None:
            print(f"({self.label}: {self.n} steps in {time.perf_counter() - self.start:.1f}s)", file=self.out)

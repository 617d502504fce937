"""docs/custom_ops.md, section "Writing and checking your own rule ...": its code blocks run as written."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "custom_ops.md"
SECTION = "## Writing and checking your own rule for a torch.library custom op"


def section_code() -> str:
    text = DOC.read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    blocks = re.findall(r"```python\n(.*?)```", text[start : end if end != -1 else None], flags=re.S)
    assert len(blocks) >= 5, f"expected the section's code blocks, found {len(blocks)}"
    return "\n".join(blocks)


def test_custom_op_section_runs() -> None:
    namespace: dict[str, object] = {}
    exec(compile(section_code(), f"{DOC}:custom-op-section", "exec"), namespace)  # noqa: S102
    # the blocks assert their own results; make sure the last one (grouped mm) actually ran
    assert "out" in namespace and "keep" in namespace

"""The runnable examples in the docs run: every ```python block of the pages listed here."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGES = ["adding-a-benchmark.md", pytest.param("envs.md", marks=pytest.mark.slow), "reliability.md"]


def blocks(page: str) -> list[tuple[int, str]]:
    text = (DOCS / page).read_text()
    return [(text[: m.start()].count("\n") + 1, m.group(1)) for m in re.finditer(r"```python\n(.*?)```", text, re.DOTALL)]


@pytest.mark.parametrize("page", PAGES)
def test_python_blocks_run(page, shared_data):
    found = blocks(page)
    assert found, f"docs/{page} has no python examples"
    for line, code in found:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, f"docs/{page}, block at line {line} failed:\n{out.stderr[-2000:]}"

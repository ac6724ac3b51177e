"""The guides' Python examples run as written against a real server (issue 35): every
```python block of ``docs/*.md``, in a fresh interpreter, with ``localhost:50051`` meaning
the test server. A block marked ```python fragment is a piece of a larger program and is
left out."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"
BLOCK = re.compile(r"^```python\n(.*?)^```", flags=re.DOTALL | re.MULTILINE)
EXPECTED = {
    "frameworks.md#1": "Ana is vegetarian.",
    "frameworks.md#2": "The staging database is restored every Sunday night.",
    "python.md#1": "The user prefers metric units.",
}
"""What an example's output must show, where it prints what it stored."""


def _examples() -> list[tuple[str, str]]:
    found = []
    for guide in sorted(DOCS.glob("*.md")):
        for number, code in enumerate(BLOCK.findall(guide.read_text()), start=1):
            found.append((f"{guide.name}#{number}", code))
    return found


def test_the_guides_have_runnable_examples() -> None:
    assert set(EXPECTED) <= {name for name, _ in _examples()}


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("name", "code"), _examples(), ids=[n for n, _ in _examples()])
def test_a_guide_example_runs_as_written(
    name: str, code: str, calor_target: str, channel_name: str
) -> None:
    env = {**os.environ, "CALOR_TARGET": calor_target, "CALOR_CHANNEL": channel_name}
    program = code.replace("localhost:50051", calor_target)
    done = subprocess.run(
        [sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=100
    )
    assert done.returncode == 0, f"{name} failed:\n{done.stderr}"
    assert done.stdout.strip(), f"{name} printed nothing"
    if name in EXPECTED:
        assert EXPECTED[name] in done.stdout, done.stdout

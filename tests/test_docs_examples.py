"""The guides' examples hold (issue 35): every ```python block of ``docs/*.md`` runs as
written against a real server, in a fresh interpreter, with ``localhost:50051`` meaning
the test server (a block marked ```python fragment is a piece of a larger program and is
left out); every ``calor`` command line of a shell block in the guides and the README is
one the CLI accepts, its verbs and flags as written."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from calor.client import cli

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
BLOCK = re.compile(r"^```python\n(.*?)^```", flags=re.DOTALL | re.MULTILINE)
SHELL = re.compile(r"^```sh\n(.*?)^```", flags=re.DOTALL | re.MULTILINE)
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


def _command_lines() -> list[tuple[str, list[str]]]:
    """Every ``calor`` command of the guides' and the README's shell blocks: where it is
    written and its arguments (environment assignments and comments left out)."""
    found = []
    for page in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        for block in SHELL.findall(page.read_text()):
            for line in block.replace("\\\n", " ").splitlines():
                words = shlex.split(line.removeprefix("$ "), comments=True)
                while words and re.match(r"^[A-Z_]+=", words[0]):
                    words = words[1:]
                for start, word in enumerate(words):  # `make serve && calor ...` too
                    if word in ("calor", ".venv/bin/calor") and (
                        start == 0 or words[start - 1] == "&&"
                    ):
                        end = words.index("&&", start) if "&&" in words[start:] else len(words)
                        found.append((f"{page.name}: {line.strip()[:60]}", words[start + 1 : end]))
    return found


def test_the_guides_show_calor_commands() -> None:
    assert len(_command_lines()) >= 40


@pytest.mark.parametrize(("where", "argv"), _command_lines(), ids=[w for w, _ in _command_lines()])
def test_a_documented_command_is_one_the_cli_accepts(where: str, argv: list[str]) -> None:
    try:
        cli._parser().parse_args(argv)
    except SystemExit as stop:  # a usage error
        pytest.fail(f"{where}: `calor {shlex.join(argv)}` is refused (exit {stop.code})")

"""The package as a user installs it (issue 35, points 1 and 2): the wheel ``python -m
build`` makes installs alone, as the client, the CLI and ``calor mcp``, without the
server's packages or the model, stays small, and drives a running server from a fresh
venv, where the README's first screen (its Python example, its CLI line, its MCP
entry) runs as written."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LIMIT_MB = 120
SERVER_ONLY = ("numpy", "onnxruntime", "rocksdict", "faiss-cpu", "tokenizers", "compartment")


def _run(*command: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(c) for c in command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, f"{command}: {done.stdout}\n{done.stderr}"
    return done.stdout


def _size_mb(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 1e6


@pytest.mark.timeout(600)
def test_the_base_wheel_installs_alone_and_drives_a_server(
    tmp_path: Path, calor_target: str, channel_name: str
) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONWARNINGS"] = "ignore"
    dist = tmp_path / "dist"
    _run(sys.executable, "-m", "build", "--wheel", "--outdir", dist, ROOT, cwd=tmp_path, env=env)
    [wheel] = dist.glob("calor-*.whl")
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", venv, cwd=tmp_path, env=env)
    bin_dir = venv / "bin"
    _run(bin_dir / "pip", "install", "-q", wheel, cwd=tmp_path, env=env)

    installed = _run(bin_dir / "pip", "list", "--format=freeze", cwd=tmp_path, env=env).lower()
    assert not [p for p in SERVER_ONLY if f"{p}==" in installed], installed
    size = _size_mb(venv)
    assert size < LIMIT_MB, f"the base install takes {size:.0f} MB"

    calor = [bin_dir / "calor", "--target", calor_target, "--channel", channel_name]
    out = _run(*calor, "store", "The wheel test stored this note.", cwd=tmp_path, env=env)
    assert out.startswith("stored ")
    out = _run(*calor, "recall", "what did the wheel test store?", cwd=tmp_path, env=env)
    assert "The wheel test stored this note." in out

    client = (
        "from calor.client import CalorClient\n"
        "with CalorClient() as calor:\n"
        "    print(calor.recall('the wheel test note').hits[0].memory.text)\n"
    )
    configured = {**env, "CALOR_TARGET": calor_target, "CALOR_CHANNEL": channel_name}
    out = _run(bin_dir / "python", "-c", client, cwd=tmp_path, env=configured)
    assert out.strip() == "The wheel test stored this note."

    _walk_the_readme(bin_dir, tmp_path, configured)

    serve = subprocess.run(
        [str(bin_dir / "calor"), "serve"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert serve.returncode == 1
    assert "pip install 'calor[server]'" in serve.stderr


def _blocks(language: str) -> list[str]:
    """The README's fenced code blocks of one language, in order."""
    text = (ROOT / "README.md").read_text()
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)


def _walk_the_readme(bin_dir: Path, cwd: Path, env: dict[str, str]) -> None:
    """The README's examples as a newcomer runs them, against the configured server."""
    [example] = _blocks("python")
    out = _run(bin_dir / "python", "-c", example, cwd=cwd, env=env)
    assert "high The user is allergic to peanuts." in out.splitlines()[0]
    shell = [b for b in _blocks("sh") if "calor store" in b]
    assert len(shell) == 1
    line = shell[0].strip().replace(".venv/bin/calor", str(bin_dir / "calor"))
    done = subprocess.run(line, shell=True, cwd=cwd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "Deploys go out on Tuesdays." in done.stdout
    [entry] = _blocks("json")
    calor = json.loads(entry)["mcpServers"]["calor"]
    assert calor["args"][0] == "mcp" and calor["command"].endswith("/.venv/bin/calor")
    printed = _run(bin_dir / "calor", "mcp", "--print-config", "--channel", "me", cwd=cwd, env=env)
    assert json.loads(printed)["mcpServers"]["calor"]["args"][:1] == ["mcp"]

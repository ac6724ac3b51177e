"""The shape of the code: which part may import which, one write path, one key schema.

Imports are read from the source (every ``import``, lazy ones inside functions too), so
the rules hold for any code path, not only the ones a test happens to run.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"server": "calor.server", "triggers": "calor.triggers", "models": "calor.models"}
COMPOSITION_ROOT = "calor.server.app"  # builds the server: it alone wires server and triggers
# The root's parts: one store's engine and triggers, a cluster node's shards, and the
# way its calls go to them.
ROOT_PARTS = ("calor.server.shard", "calor.server.cluster_host", "calor.server.cluster_routes")


def modules() -> Iterator[tuple[str, Path]]:
    """Every module of the server, the trigger engine and the models, by dotted name."""
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            yield ".".join((package, *parts)), path


def imports(path: Path) -> set[str]:
    """The calor modules a file imports, anywhere in it."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name.startswith("calor.")}


def graph() -> dict[str, set[str]]:
    """Module → the modules of the package it imports."""
    names = dict(modules())
    return {
        name: {i for i in imports(path) if i in names and i != name} for name, path in names.items()
    }


def part(module: str) -> str:
    """The part of the code a module belongs to: a subpackage of the server, the server's
    shared top-level modules, the composition root, the trigger engine, or the models."""
    if module == COMPOSITION_ROOT or module in ROOT_PARTS:
        return COMPOSITION_ROOT
    pieces = module.split(".")
    if pieces[1] == "server" and len(pieces) > 3:
        return ".".join(pieces[:3])
    if pieces[1] == "server" and len(pieces) == 3 and (ROOT / "server" / pieces[2]).is_dir():
        return module  # a subpackage's own __init__
    return ".".join(pieces[:2])


def cycle(edges: dict[str, set[str]]) -> list[str]:
    """One cycle of a directed graph, or [] when it has none."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return []

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return []


def test_the_models_import_nothing_of_the_server_or_the_triggers() -> None:
    offending = {
        name: sorted(i for i in deps if not i.startswith("calor.models"))
        for name, deps in graph().items()
        if name.startswith("calor.models")
    }
    assert {k: v for k, v in offending.items() if v} == {}


def test_no_module_imports_itself_back() -> None:
    assert cycle(graph()) == []


def test_the_parts_import_each_other_in_one_direction_only() -> None:
    """models ← server's shared modules ← thermo ← storage, recall ← engine ← api ←
    triggers ← the composition root: no part reaches back to one that imports it."""
    parts: dict[str, set[str]] = {}
    for name, deps in graph().items():
        here = part(name)
        parts.setdefault(here, set()).update(part(d) for d in deps if part(d) != here)
    assert cycle(parts) == []
    reaching_triggers = {
        p for p, deps in parts.items() if "calor.triggers" in deps and p != COMPOSITION_ROOT
    }
    assert {p for p in reaching_triggers if p.startswith("calor.server")} == set()
    assert parts["calor.models"] == set()


def _package_sources() -> Iterator[tuple[Path, str]]:
    for _, path in modules():
        yield path, path.read_text()
    for path in sorted((ROOT / "client").glob("*.py")):
        yield path, path.read_text()


def test_one_module_opens_write_batches_and_one_builds_keys() -> None:
    batch = re.compile(r"WriteBatch\(")
    raw_key = re.compile(r"""b["'](?:[a-z]|meta):""")
    opens = {p.relative_to(ROOT).as_posix() for p, text in _package_sources() if batch.search(text)}
    keys = {
        p.relative_to(ROOT).as_posix() for p, text in _package_sources() if raw_key.search(text)
    }
    assert opens == {"server/storage/store.py"}
    assert keys == {"server/storage/keys.py"}


def test_only_the_one_write_path_commits_changes() -> None:
    """Every live change goes through server/engine/changes.py; the offline check writes
    its repairs itself (there is no live view to apply them to)."""
    writers = {
        p.relative_to(ROOT).as_posix()
        for p, text in _package_sources()
        if re.search(r"\bstore\.write(_batch)?\(|self\._store\.write(_batch)?\(", text)
    }
    assert writers == {"server/engine/changes.py", "server/storage/consistency.py"}

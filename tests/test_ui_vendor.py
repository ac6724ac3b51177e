"""The JavaScript libraries `calor ui` ships are the ones package-lock.json pins: each
file under client/ui/static/vendor is byte for byte the one `npm ci` installs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

UI = Path(__file__).resolve().parent.parent / "client" / "ui"
VENDOR = UI / "vendor"
SHIPPED = UI / "static" / "vendor"
FROM_PACKAGES = {  # shipped file: (package, file in the package)
    "uPlot.iife.min.js": ("uplot", "dist/uPlot.iife.min.js"),
    "uPlot.min.css": ("uplot", "dist/uPlot.min.css"),
    "uPlot.LICENSE": ("uplot", "LICENSE"),
    "cytoscape.min.js": ("cytoscape", "dist/cytoscape.min.js"),
    "cytoscape.LICENSE": ("cytoscape", "LICENSE"),
}


def test_every_shipped_library_file_comes_from_a_pinned_package() -> None:
    assert sorted(p.name for p in SHIPPED.iterdir()) == sorted(FROM_PACKAGES)
    wanted = json.loads((VENDOR / "package.json").read_text())["dependencies"]
    locked = json.loads((VENDOR / "package-lock.json").read_text())["packages"]
    for package, _ in FROM_PACKAGES.values():
        assert locked[f"node_modules/{package}"]["version"] == wanted[package]


def test_the_shipped_files_are_those_npm_ci_installs() -> None:
    installed = VENDOR / "node_modules"
    if not (installed / ".installed").exists():
        pytest.skip("client/ui/vendor's packages are not installed (make test runs npm ci)")
    for name, (package, inside) in FROM_PACKAGES.items():
        assert (SHIPPED / name).read_bytes() == (installed / package / inside).read_bytes(), (
            f"{name} differs from {package}'s {inside}: run make ui-vendor"
        )

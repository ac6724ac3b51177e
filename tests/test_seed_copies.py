"""The vendored seed tables under tests/data/vectors are the design's own, unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import VECTORS

SHARED = Path(__file__).resolve().parents[2] / "shared" / "vectors"


@pytest.mark.parametrize("name", ["heat.json", "temporal.json", "bge_small_golden.json"])
def test_vendored_copy_matches_the_design(name: str) -> None:
    if not (SHARED / name).exists():
        pytest.skip("../shared/vectors is not beside this checkout")
    assert (VECTORS / name).read_bytes() == (SHARED / name).read_bytes()

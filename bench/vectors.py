"""The baselines' embeddings: the server's model run in the bench process, cached on disk.

The dense baseline and the fusion baseline need every turn embedded with the same
model Calor uses. Embedding LongMemEval takes the better part of an hour on a small
CPU, so the vectors are kept under ``bench/.cache/vectors/`` (ignored by git), one
file per question, named by the model and a digest of the exact texts: a changed text
or model never reads a stale file. Calor itself never sees these vectors; the server
embeds everything it stores.

Run it alone to fill the cache ahead of a bench run::

    .venv/bin/python bench/vectors.py --split oracle
    .venv/bin/python bench/vectors.py --split long-replies --questions 100
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parent))

import longmemeval  # noqa: E402
from longmemeval import Question  # noqa: E402

from calor.models.embedder import OnnxEmbedder  # noqa: E402

CACHE = longmemeval.REPO / "bench" / ".cache" / "vectors"

F32 = npt.NDArray[np.float32]
_FILL_CHUNK = 512


def model_folder(embedder: OnnxEmbedder, root: Path = CACHE) -> Path:
    """The cache folder of ``embedder``'s vectors (made if missing)."""
    folder = root / embedder.model_id.replace(":", "-")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def load_or_make(path: Path, make: Callable[[], F32]) -> F32:
    """The matrix cached at ``path``, or ``make()``'s, written there first (atomically:
    a run cut short leaves no partial file under the name)."""
    if path.is_file():
        cached: F32 = np.load(path)
        return cached
    matrix = make()
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    with partial.open("wb") as f:
        np.save(f, matrix)
    partial.replace(path)
    return matrix


class VectorCache:
    """Turn and question vectors per LongMemEval question, computed once."""

    def __init__(self, embedder: OnnxEmbedder, root: Path = CACHE) -> None:
        self.embedder = embedder
        self.folder = model_folder(embedder, root)
        self.embedded_texts = 0
        self.embed_seconds = 0.0

    def path(self, question: Question) -> Path:
        return self.folder / f"{question.question_id}-{question.digest}.npy"

    def has(self, question: Question) -> bool:
        return self.path(question).is_file()

    def get(self, question: Question) -> tuple[F32, F32]:
        """``(turn vectors [n, dim], question vector [dim])``, embedding on a miss."""

        def embed() -> F32:
            started = time.perf_counter()
            turns = self.embedder.embed_passages([turn.text for turn in question.turns])
            query = self.embedder.embed_query(question.text)
            self.embed_seconds += time.perf_counter() - started
            self.embedded_texts += len(question.turns) + 1
            return np.vstack([turns, query[None, :]]).astype(np.float32)

        matrix = load_or_make(self.path(question), embed)
        return matrix[:-1], matrix[-1]

    def fill(self, questions: Sequence[Question], progress: bool = False) -> None:
        """Caches every question of ``questions`` not cached yet, each text embedded once
        however many haystacks hold it (built splits share most of theirs)."""
        missing = [q for q in questions if not self.has(q)]
        texts = list(dict.fromkeys(t.text for q in missing for t in q.turns))
        vectors: dict[str, F32] = {}
        started = time.perf_counter()
        for first in range(0, len(texts), _FILL_CHUNK):
            chunk = texts[first : first + _FILL_CHUNK]
            vectors.update(zip(chunk, self.embedder.embed_passages(chunk), strict=True))
            if progress:
                print(
                    f"{len(vectors)}/{len(texts)} texts embedded, "
                    f"{time.perf_counter() - started:.0f} s",
                    flush=True,
                )
        self.embedded_texts += len(texts) + len(missing)
        for question in missing:
            rows = [vectors[t.text] for t in question.turns]
            rows.append(self.embedder.embed_query(question.text))
            load_or_make(self.path(question), functools.partial(np.stack, rows))
        self.embed_seconds += time.perf_counter() - started


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--split", choices=longmemeval.SPLIT_NAMES, default="oracle")
    parser.add_argument("--questions", type=int, default=None)
    args = parser.parse_args(argv)
    questions = longmemeval.load(args.split, args.questions)
    cache = VectorCache(OnnxEmbedder.load(threads=2))
    cache.fill(questions, progress=True)
    print(f"{len(questions)} questions cached, {cache.embedded_texts} texts embedded")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

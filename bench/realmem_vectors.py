"""RealMem's embeddings: the server's model run in the bench process, cached on disk.

As :mod:`vectors` does for LongMemEval: one file per persona under
``bench/.cache/vectors/<model>/`` (ignored by git), named by the persona and a digest
of the exact texts, holding every stored turn's vector (as a passage) and then every
scored query's (with the model's query prefix, :meth:`OnnxEmbedder.embed_query`). A
changed text, role label or model never reads a stale file.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parent))

from realmem_data import Persona  # noqa: E402
from vectors import CACHE, load_or_make, model_folder  # noqa: E402

from calor.models.embedder import OnnxEmbedder  # noqa: E402

F32 = npt.NDArray[np.float32]

# Passages embedded per call, so a long persona reports its progress.
_CHUNK = 256


class PersonaVectors:
    """Turn and query vectors per RealMem persona, computed once."""

    def __init__(self, embedder: OnnxEmbedder, root: Path = CACHE) -> None:
        self.embedder = embedder
        self.folder = model_folder(embedder, root)
        self.embedded_texts = 0
        self.embed_seconds = 0.0

    def path(self, persona: Persona) -> Path:
        return self.folder / f"realmem-{persona.name}-{persona.digest}.npy"

    def has(self, persona: Persona) -> bool:
        return self.path(persona).is_file()

    def get(self, persona: Persona, progress: bool = False) -> tuple[F32, F32]:
        """``(turn vectors [turns, dim], query vectors [queries, dim])``, embedding on
        a miss (``progress`` prints how far it got)."""
        matrix = load_or_make(self.path(persona), lambda: self._embed(persona, progress))
        split = len(persona.turns)
        return matrix[:split], matrix[split:]

    def _embed(self, persona: Persona, progress: bool) -> F32:
        started = time.perf_counter()
        texts = [turn.text for turn in persona.turns]
        parts: list[F32] = []
        for start in range(0, len(texts), _CHUNK):
            parts.append(self.embedder.embed_passages(texts[start : start + _CHUNK]))
            if progress:
                done, elapsed = start + len(parts[-1]), time.perf_counter() - started
                print(
                    f"  {persona.name}: {done}/{len(texts)} turns, {elapsed:.0f} s "
                    f"({done / elapsed:.1f} turns/s)",
                    file=sys.stderr,
                    flush=True,
                )
        parts.extend(self.embedder.embed_query(q.text)[None, :] for q in persona.queries)
        self.embed_seconds += time.perf_counter() - started
        self.embedded_texts += len(texts) + len(persona.queries)
        return np.vstack(parts).astype(np.float32)

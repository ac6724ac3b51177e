"""What a channel was told to forget and not learn again: the embeddings of memories
forgotten with ``reject`` (their text is gone), and the closest of them to a new memory."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from calor.server.storage.keys import Keys, split
from calor.server.storage.ops import PutKey

__all__ = ["Rejections", "rejection"]

_F32 = npt.NDArray[np.float32]


def rejection(channel: str, memory_id: str, vector: _F32) -> PutKey:
    """The write that keeps a forgotten memory's embedding as a rejection of ``channel``."""
    return PutKey(Keys.rejection(channel, memory_id), np.asarray(vector, dtype="<f4").tobytes())


@dataclass
class Rejections:
    """A channel's rejections: unit embeddings by the id of the memory that was forgotten."""

    channel: str
    _ids: list[str] = field(default_factory=list)
    _rows: list[_F32] = field(default_factory=list)
    _matrix: _F32 | None = None

    def __len__(self) -> int:
        return len(self._ids)

    def take(self, put: PutKey) -> bool:
        """Hold the rejection a write keeps, if it is one of this channel's; whether it was."""
        prefix = Keys.rejection(self.channel, "")
        if not put.key.startswith(prefix):
            return False
        vector = np.frombuffer(put.value, dtype="<f4").astype(np.float32)
        norm = float(np.linalg.norm(vector))
        if norm > 0.0:
            self._ids.append(split(put.key)[1])
            self._rows.append(vector / norm)
            self._matrix = None
        return True

    def closest(self, vector: _F32) -> tuple[str, float] | None:
        """The rejection nearest to a unit embedding and its cosine; None when there are
        none."""
        if not self._ids:
            return None
        if self._matrix is None:
            self._matrix = np.stack(self._rows)
        sims = self._matrix @ np.asarray(vector, dtype=np.float32)
        best = int(np.argmax(sims))
        return self._ids[best], float(sims[best])

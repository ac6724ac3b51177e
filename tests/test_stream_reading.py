"""A stream reads each chunk's texts (type, entities) while later items arrive and the
model embeds: what it stores reads exactly as the same texts stored one by one."""

from __future__ import annotations

from pathlib import Path

import pytest

from calor.client import CalorClient
from calor.models.embedder import OnnxEmbedder
from calor.server.api import stream_store
from calor.server.clock import SystemClock
from calor.server.config import ServerConfig
from tests.conftest import ServerThread

KINDS = [
    "I prefer tea over coffee in the morning, {i}.",
    "Alice Chen moved the Berlin office to Hamburg in week {i}.",
    "Always run `make test` before pushing branch feature-{i}.",
    "The deploy of service api-{i} failed with error E40{i}.",
    "We hiked up Mount Tam with Priya on day {i}.",
]


@pytest.mark.parametrize("staged_part", [stream_store.STAGED_PART, 256])
def test_a_streamed_batch_reads_like_texts_stored_one_by_one(
    embedder: OnnxEmbedder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, staged_part: int
) -> None:
    # Staged a part at a time as the stream arrives (parts of 256), or whole at its end.
    monkeypatch.setattr(stream_store, "STAGED_PART", staged_part)
    texts = [KINDS[i % len(KINDS)].format(i=i) for i in range(600)]  # 2 chunks read ahead
    config = ServerConfig(data_dir=tmp_path, host="127.0.0.1", port=0)
    server = ServerThread(config, SystemClock(), lambda: embedder)
    try:
        with CalorClient(server.target, channel="stream") as client:
            ids = client.store_many(texts)
            assert len(ids) == 600
            for position in (0, 1, 2, 3, 4, 255, 256, 257, 511, 512, 513, 599):
                streamed = client.inspect(ids[position]).memory
                alone = client.store(texts[position], channel=f"one-{position}")
                assert streamed.text == texts[position]
                assert streamed.memory_type == alone.memory_type
                assert list(streamed.entities) == list(alone.entities)
            assert len({client.inspect(i).memory.memory_type for i in ids[:5]}) > 1
    finally:
        server.stop()

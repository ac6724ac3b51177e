"""Export and import through the Python clients and ``calor export`` / ``calor import``."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from calor.client import AsyncCalorClient, CalorClient, InvalidArgumentError, _cli_transfer
from calor.client._progress import Progress
from calor.client._transfer import Chunker, export_total
from calor.v1 import memory_pb2
from tests.helpers import Run

CREATED = datetime(2025, 11, 3, 8, 30, 15, 250_000, tzinfo=UTC)


def _store_samples(client: CalorClient) -> None:
    """Three memories that use every field an export carries."""
    client.store(
        "The user is allergic to peanuts.",
        memory_type="core",
        tags={"topic": "health", "odd,key": "a=b"},
        keystone=True,
        created_at=CREATED,
    )
    client.store(
        "Deploy steps:\n\n```sh\nmake test && make deploy\n```\n- not a bullet",
        memory_type="procedural",
        tags={"team": "infra"},
    )
    client.store("Carriage\rreturn and\r\nCRLF stay put.", memory_type="fact")


def _fields(memory: memory_pb2.Memory) -> tuple[object, ...]:
    return (
        memory.memory_type,
        dict(memory.tags),
        memory.keystone,
        memory.created_at.ToMicroseconds(),
    )


def _by_text(client: CalorClient, channel: str) -> dict[str, tuple[object, ...]]:
    return {m.text: _fields(m) for m in client.iter_memories(channel=channel)}


def _assert_copied(client: CalorClient, original: str, copy: str) -> None:
    """The copy holds the original's texts with the same type, tags, keystone and time."""
    before, after = _by_text(client, original), _by_text(client, copy)
    assert set(after) == set(before)
    for text, (*fields, created) in before.items():
        *copied, copied_created = after[text]
        assert copied == fields
        # The export writes microseconds; the store keeps float seconds.
        assert copied_created == pytest.approx(created, abs=1)


def test_cli_export_then_import_keeps_every_field(
    calor: Run, client: CalorClient, channel_name: str, tmp_path: Path
) -> None:
    _store_samples(client)
    out = tmp_path / "export.md"

    status, stdout, _ = calor("export", "--out", str(out))
    assert status == 0
    assert stdout == f"exported 3 memories to {out}\n"
    document = out.read_bytes().decode("utf-8")
    assert document.startswith(f"# Calor export: {channel_name}\n")
    assert "· 3 memories" in document
    assert "Carriage\rreturn and\r\nCRLF" in document  # written without newline translation

    other = channel_name + "-copy"
    status, stdout, _ = calor("import", str(out), "--channel", other)
    assert status == 0
    assert stdout == "imported 3 memories\n"

    _assert_copied(client, channel_name, other)
    before = _by_text(client, channel_name)
    assert len(before) == 3
    assert before["The user is allergic to peanuts."] == (
        memory_pb2.MEMORY_TYPE_CORE,
        {"topic": "health", "odd,key": "a=b"},
        True,
        int(CREATED.timestamp() * 1_000_000),
    )


def test_export_to_stdout_then_import_from_stdin_as_json(
    calor: Run, client: CalorClient, channel_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _store_samples(client)
    status, document, _ = calor("export")
    assert status == 0
    assert document.startswith(f"# Calor export: {channel_name}\n")

    monkeypatch.setattr("sys.stdin", io.StringIO(document))
    status, stdout, _ = calor("--json", "import", "-", "--channel", "copy-" + channel_name)
    assert status == 0
    ids = json.loads(stdout)["ids"]
    assert len(ids) == 3
    _assert_copied(client, channel_name, "copy-" + channel_name)


def test_progress_counts_memories_out_and_in(
    calor: Run,
    client: CalorClient,
    channel_name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _store_samples(client)
    bars: list[Progress] = []
    streams: list[io.StringIO] = []

    def progress(total: int | None = None, *, label: str = "") -> Progress:
        streams.append(io.StringIO())
        bars.append(Progress(total, label=label, stream=streams[-1], force=True))
        return bars[-1]

    monkeypatch.setattr(_cli_transfer, "Progress", progress)
    out = tmp_path / "export.md"
    assert calor("export", "--out", str(out))[0] == 0
    assert (
        calor("import", str(out), "--channel", "in-" + channel_name, "--chunk-chars", "64")[0] == 0
    )

    exported, imported = bars
    assert (exported.label, exported.count, exported.total) == ("export", 3, 3)
    assert (imported.label, imported.count, imported.total, imported.phase) == (
        "import",
        3,
        3,
        "done",
    )
    assert "3/3" in streams[0].getvalue()
    assert "import (done)" in streams[1].getvalue() and "3/3" in streams[1].getvalue()


def test_async_client_round_trip(calor_target: str, client: CalorClient, channel_name: str) -> None:
    _store_samples(client)
    other = channel_name + "-async"

    async def pieces(text: str) -> AsyncIterator[str]:
        for start in range(0, len(text), 50):
            yield text[start : start + 50]

    async def scenario() -> tuple[list[int], str, list[str]]:
        async with AsyncCalorClient(calor_target, channel=channel_name) as calor:
            chunks = [chunk async for chunk in calor.export()]
            document = "".join(chunk.markdown for chunk in chunks)
            ids = await calor.import_markdown(pieces(document), channel=other, chunk_chars=7)
        return [chunk.memories for chunk in chunks], document, ids

    counts, document, ids = asyncio.run(scenario())
    assert counts[0] == 0
    assert sum(counts) == 3
    assert export_total(document) == 3
    assert len(ids) == 3
    _assert_copied(client, channel_name, other)


def test_sync_client_streams_a_string_in_small_chunks(client: CalorClient) -> None:
    ids = client.import_markdown("- one\n- two\n- three\n", chunk_chars=3)
    assert len(ids) == 3
    assert sorted(m.text for m in client.iter_memories()) == ["one", "three", "two"]


def test_import_of_a_plain_bullet_list(calor: Run, client: CalorClient, tmp_path: Path) -> None:
    notes = tmp_path / "notes.md"
    notes.write_text(
        "Things to do.\n\n"
        "- Buy oat milk\n"
        "- Call the plumber\n  about the leak\n"
        "* Renew the passport\n",
        encoding="utf-8",
    )
    status, stdout, _ = calor("import", str(notes))
    assert status == 0
    assert stdout == "imported 3 memories\n"
    assert sorted(m.text for m in client.iter_memories()) == [
        "Buy oat milk",
        "Call the plumber\nabout the leak",
        "Renew the passport",
    ]


def test_a_bad_file_exits_2_and_imports_nothing(
    calor: Run, client: CalorClient, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.md"
    bad.write_text(
        "- fine\n\n## A memory\n- type: gossip\n\n```text\nhello\n```\n", encoding="utf-8"
    )
    status, stdout, stderr = calor("import", str(bad))
    assert status == 2
    assert stdout == ""
    assert stderr.startswith("error: ")
    assert "line" in stderr
    assert client.identity().total == 0


def test_a_file_that_is_not_utf8_exits_2_and_imports_nothing(
    calor: Run, client: CalorClient, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.md"
    bad.write_bytes(b"- fine\n" * 100 + b"- \xff\xfe broken\n")
    status, _, stderr = calor("import", str(bad), "--chunk-chars", "64")
    assert status == 2
    assert stderr.startswith("error: ") and "not UTF-8" in stderr
    assert client.identity().total == 0


def test_a_missing_file_is_an_error(calor: Run, tmp_path: Path) -> None:
    status, _, stderr = calor("import", str(tmp_path / "nowhere.md"))
    assert status == 1
    assert stderr.startswith("error: ")


def test_a_failing_source_cancels_the_import(client: CalorClient) -> None:
    def source() -> Iterator[str]:
        yield "- one\n- two\n"
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):
        client.import_markdown(source())
    assert client.identity().total == 0

    async def scenario() -> None:
        async with AsyncCalorClient(client.target, channel=client.channel) as calor:
            await calor.import_markdown(source())

    with pytest.raises(RuntimeError, match="disk on fire"):
        asyncio.run(scenario())
    assert client.identity().total == 0


def test_bad_chunk_sizes_are_refused(calor: Run, client: CalorClient) -> None:
    with pytest.raises(InvalidArgumentError):
        client.import_markdown("- note", chunk_chars=0)
    status, _, stderr = calor("import", "-", "--chunk-chars", "0")
    assert status == 2
    assert "--chunk-chars" in stderr


def test_chunker_joins_and_splits_pieces() -> None:
    chunker = Chunker(4)
    assert list(chunker.chunks(["a", "bc", "defghij", "", "k"])) == ["abcd", "efgh", "ijk"]
    assert list(Chunker(3).chunks("abcdefg")) == ["abc", "def", "g"]
    assert list(Chunker(3).chunks([])) == []


def test_export_total_reads_the_header() -> None:
    assert export_total("# Calor export: x\n\nExported 2026-03-01T09:00:00Z · 1 memory\n") == 1
    assert export_total("Exported 2026-03-01T09:00:00Z · 12,345 memories") == 12345
    assert export_total("# Some notes\n") is None


def test_export_leaves_the_loop_early(client: CalorClient) -> None:
    _store_samples(client)
    header = next(iter(client.export()))
    assert header.memories == 0
    assert export_total(header.markdown) == 3
    stream = client.export()
    for _ in stream:
        break
    stream.close()  # cancels the call underneath

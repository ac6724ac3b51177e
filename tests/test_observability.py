"""What an operator sees: Prometheus metrics, one JSON log line per request, ServerStatus
and ``calor status``."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from calor.client.cli import main
from calor.server.api import auth_file
from calor.server.api.grants import Grants, parse_grant
from calor.server.clock import ManualClock
from calor.server.engine.states import RecordTable
from calor.server.errors import ResourceExhaustedError
from calor.server.events import EventRecord
from calor.server.logs import JsonFormatter
from calor.server.records import MemoryRecord
from calor.triggers.subscriptions import EventFilter, SubscriptionHub
from calor.v1 import memory_pb2, settings_service_pb2, settings_service_pb2_grpc
from calor.v1 import memory_service_pb2 as pb
from calor.v1 import trigger_service_pb2 as tpb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from calor.v1.trigger_service_pb2_grpc import TriggerServiceStub
from tests.calor_process import CalorProcess, free_port
from tests.conftest import ServerThread

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

STORE = "calor.v1.MemoryService/Store"
RECALL = "calor.v1.MemoryService/Recall"


def scrape(port: int) -> Samples:
    """Every sample the metrics endpoint shows, by name and labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def settled(read: Callable[[], Samples], done: Callable[[Samples], bool]) -> Samples:
    """What ``read`` answers once ``done`` holds: a call refused with a status reaches the
    client before its handler has finished reporting it."""
    deadline = time.monotonic() + 10
    while True:
        samples = read()
        if done(samples) or time.monotonic() > deadline:
            return samples
        time.sleep(0.01)


def value(samples: Samples, name: str, **labels: str) -> float:
    """One sample's value; 0 when the endpoint does not show it (yet)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def calls(samples: Samples, method: str, code: str) -> float:
    """How many calls of ``method`` ended with ``code``."""
    return value(
        samples,
        "rpc_server_call_duration_seconds_count",
        rpc_method=method,
        rpc_response_status_code=code,
    )


@pytest.fixture(scope="module")
def observed(start_server: Callable[..., ServerThread]) -> ServerThread:
    """A server of this module's own, with its metrics endpoint on."""
    return start_server(metrics_port=free_port())


@pytest.fixture(scope="module")
def stub(observed: ServerThread) -> Iterator[MemoryServiceStub]:
    with grpc.insecure_channel(observed.target) as channel:
        yield MemoryServiceStub(channel)


@pytest.fixture
def request_log() -> Iterator[io.StringIO]:
    """The request log lines, as the server writes them with ``--log-format json``."""
    lines = io.StringIO()
    handler = logging.StreamHandler(lines)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("calor.request")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield lines
    logger.removeHandler(handler)
    logger.setLevel(level)


def test_per_rpc_histograms_move_when_requests_are_made(
    observed: ServerThread, stub: MemoryServiceStub
) -> None:
    before = scrape(observed.server.metrics_port)
    stub.Store(pb.StoreRequest(channel="metrics", text="The staging cluster runs in Frankfurt."))
    stub.Recall(pb.RecallRequest(channel="metrics", query="where does staging run?"))
    with pytest.raises(grpc.RpcError) as refused:
        stub.Store(pb.StoreRequest(channel="metrics", text=""))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    after = settled(
        lambda: scrape(observed.server.metrics_port),
        lambda now: (
            calls(now, STORE, "INVALID_ARGUMENT") > calls(before, STORE, "INVALID_ARGUMENT")
        ),
    )

    assert calls(after, STORE, "OK") == calls(before, STORE, "OK") + 1
    assert calls(after, RECALL, "OK") == calls(before, RECALL, "OK") + 1
    assert calls(after, STORE, "INVALID_ARGUMENT") == calls(before, STORE, "INVALID_ARGUMENT") + 1
    bucket = "rpc_server_call_duration_seconds_bucket"
    assert value(
        after, bucket, rpc_method=STORE, rpc_response_status_code="OK", le="+Inf"
    ) == calls(after, STORE, "OK")

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    operation = "gen_ai_client_operation_duration_seconds_count"
    assert moved(operation, gen_ai_operation_name="create_memory", error_type="") == 1
    assert moved(operation, gen_ai_operation_name="search_memory", error_type="") == 1
    assert (
        moved(operation, gen_ai_operation_name="create_memory", error_type="INVALID_ARGUMENT") == 1
    )
    assert moved("gen_ai_memory_record_count_count", gen_ai_operation_name="search_memory") == 1
    assert moved("gen_ai_memory_record_count_sum", gen_ai_operation_name="search_memory") == 1
    assert moved("calor_recall_top_similarity_count") == 1
    assert moved("calor_embedding_batch_size_count", kind="query") >= 1
    assert moved("calor_embedding_batch_size_count", kind="passage") >= 1
    assert moved(operation, gen_ai_operation_name="embeddings", error_type="") >= 2
    assert moved("calor_events_appended_total") >= 2  # the store and the recall
    assert value(after, "process_resident_memory_bytes") > 0


PEEK_STAGES = {
    "validation",
    "embedding queue",
    "model",
    "embedding hand-off",
    "executor wait",
    "lexical search",
    "dense search",
    "fusion and scoring",
    "executor hand-off",
    "reply",
}


def test_a_recall_reports_where_its_time_went_stage_by_stage(
    observed: ServerThread, stub: MemoryServiceStub
) -> None:
    port = observed.server.metrics_port
    stub.Store(pb.StoreRequest(channel="stages", text="The backup job runs at two every night."))

    def stages(samples: Samples) -> dict[str, tuple[float, float]]:
        """Each stage of Recall's: (calls that went through it, seconds in all)."""
        counted: dict[str, tuple[float, float]] = {}
        for (name, labels), number in samples.items():
            tags = dict(labels)
            if name.startswith("calor_rpc_stage_seconds_") and tags["rpc_method"] == RECALL:
                calls_seen, seconds = counted.get(tags["stage"], (0.0, 0.0))
                if name.endswith("_count"):
                    calls_seen += number
                elif name.endswith("_sum"):
                    seconds += number
                counted[tags["stage"]] = (calls_seen, seconds)
        return counted

    def moved(before: Samples, after: Samples) -> dict[str, tuple[float, float]]:
        was, now = stages(before), stages(after)
        return {
            stage: (count - was.get(stage, (0, 0))[0], spent - was.get(stage, (0, 0))[1])
            for stage, (count, spent) in now.items()
            if count > was.get(stage, (0, 0))[0]
        }

    before = scrape(port)
    asked = pb.RecallRequest(channel="stages", query="when does the backup run?", peek=True)
    stub.Recall(asked)
    peek = moved(before, scrape(port))  # reported before the reply leaves the server
    assert set(peek) == PEEK_STAGES  # a peek warms nothing and writes nothing
    assert all(count == 1 and 0 < spent < 5 for count, spent in peek.values())
    before = scrape(port)
    asked.peek, asked.query = False, "what runs at night?"  # not the cached query
    stub.Recall(asked)
    recall = moved(before, scrape(port))
    assert set(recall) == PEEK_STAGES | {"heat effects", "commit"}
    cached = scrape(port)
    stub.Recall(asked)  # asked again: its embedding is remembered, the model is not asked
    assert "model" not in moved(cached, scrape(port))


def test_dreams_and_subscribers_are_measured(
    observed: ServerThread, stub: MemoryServiceStub
) -> None:
    before = scrape(observed.server.metrics_port)
    stub.Store(pb.StoreRequest(channel="dreamer", text="Backups run nightly at two."))
    stub.Dream(pb.DreamRequest(channel="dreamer"))
    after = scrape(observed.server.metrics_port)
    dreams = "calor_dream_duration_seconds_count"
    assert value(after, dreams, scope="channel") == value(before, dreams, scope="channel") + 1
    assert value(after, "calor_subscribers") == 0
    assert value(after, "calor_subscribers_dropped_total") == 0
    assert value(after, "calor_data_dir_bytes") > 0


def test_open_subscriptions_are_counted_while_they_last(
    observed: ServerThread, stub: MemoryServiceStub
) -> None:
    port = observed.server.metrics_port
    with grpc.insecure_channel(observed.target) as channel:
        stream = TriggerServiceStub(channel).Subscribe(tpb.SubscribeRequest(channels=["watched"]))
        stub.Store(pb.StoreRequest(channel="watched", text="The deploy window opens at six."))
        assert next(stream).event.channel == "watched"
        assert value(scrape(port), "calor_subscribers") == 1
        stream.cancel()
    after = settled(lambda: scrape(port), lambda now: value(now, "calor_subscribers") == 0)
    assert value(after, "calor_subscribers") == 0


def test_a_subscriber_cut_off_for_falling_behind_is_counted() -> None:
    async def fall_behind() -> int:
        hub = SubscriptionHub(lambda seq, n: _nothing(), queue_size=1)
        stream = hub.subscribe(EventFilter(), after_seq=0)
        waiting = asyncio.ensure_future(anext(stream))
        await asyncio.sleep(0)  # the subscriber registers and waits for its first event
        events = [EventRecord("notify", "c", 0.0).with_seq(n) for n in (1, 2, 3)]
        hub.publish(events)  # its queue holds one: it overflows
        await waiting
        with pytest.raises(ResourceExhaustedError):
            await anext(stream)
        await stream.aclose()
        return hub.dropped

    assert asyncio.run(fall_behind()) == 1


async def _nothing() -> list[EventRecord]:
    return []


def test_memory_gauges_and_server_status_match_what_was_stored(
    start_server: Callable[..., ServerThread],
) -> None:
    server = start_server(metrics_port=free_port())
    with grpc.insecure_channel(server.target) as channel:
        memories = MemoryServiceStub(channel)
        ids = [
            memories.Store(pb.StoreRequest(channel=name, text=text)).memory.id
            for name, text in (
                ("ops", "The on-call rota changes every Monday."),
                ("ops", "Deploys freeze on Fridays after noon."),
                ("ops", "The VPN certificate expires in March."),
                ("sales", "The Acme renewal is due in June."),
            )
        ]
        memories.Forget(pb.ForgetRequest(channel="ops", ids=[ids[0]]))
        status = settings_service_pb2_grpc.SettingsServiceStub(channel).ServerStatus(
            settings_service_pb2.ServerStatusRequest()
        )
    samples = scrape(server.server.metrics_port)

    assert value(samples, "calor_memory_records", state="active") == 3
    assert value(samples, "calor_memory_records", state="deleted") == 1
    assert value(samples, "calor_channels") == 2
    assert dict(status.memories_by_state) == {"active": 3, "deleted": 1}
    assert status.channels == 2
    assert status.last_seq == value(samples, "calor_events_appended_total") >= 4
    assert status.model_id and status.dim == 384
    assert status.version and status.uptime_seconds > 0
    assert status.data_bytes > 0 and status.rss_bytes > 0
    assert status.subscribers == 0
    assert (status.auth_required, status.tls) == (False, False)

    with grpc.insecure_channel(server.target) as channel:
        MemoryServiceStub(channel).DropChannel(pb.DropChannelRequest(channel="sales"))
    samples = scrape(server.server.metrics_port)
    assert value(samples, "calor_channels") == 1
    assert value(samples, "calor_memory_records", state="active") == 2
    assert value(samples, "calor_memory_records", state="deleted") == 1
    dropped = "gen_ai_client_operation_duration_seconds_count"
    assert value(samples, dropped, gen_ai_operation_name="delete_memory_store", error_type="") == 1


def test_a_request_log_line_is_json_without_text_or_query(
    observed: ServerThread, stub: MemoryServiceStub, request_log: io.StringIO
) -> None:
    text, query = "Zebra-marker 7731 lives in the attic.", "where does qx-query-4410 live?"
    stub.Store(pb.StoreRequest(channel="logged", text=text))
    stub.Recall(pb.RecallRequest(channel="logged", query=query))
    with pytest.raises(grpc.RpcError) as refused:
        stub.Inspect(pb.InspectRequest(channel="logged", id="no-such-memory"))

    inspect = "calor.v1.MemoryService/Inspect"
    settled(lambda: {}, lambda _: inspect in request_log.getvalue())
    output = request_log.getvalue()
    lines = [json.loads(line) for line in output.splitlines()]
    by_rpc = {line["rpc"]: line for line in lines}
    store, recall = by_rpc[STORE], by_rpc[RECALL]
    assert set(store) == {"time", "level", "logger", "message", "rpc", "status", "ms"} | {
        "channel",
        "key_id",
    }
    assert (store["status"], store["channel"], store["key_id"]) == ("OK", "logged", "")
    assert (store["level"], store["logger"]) == ("info", "calor.request")
    assert isinstance(store["ms"], float) and store["ms"] >= 0
    assert store["time"].endswith("+00:00")
    assert recall["status"] == "OK"
    assert by_rpc[inspect]["status"] == refused.value.code().name != "OK"
    for secret in ("Zebra-marker", "7731", "qx-query-4410", "attic"):
        assert secret not in output


def test_calor_status_shows_the_server_and_the_channel(
    observed: ServerThread, stub: MemoryServiceStub, capsys: pytest.CaptureFixture[str]
) -> None:
    stub.Store(pb.StoreRequest(channel="status-cli", text="The printer is on floor three."))
    with grpc.insecure_channel(observed.target) as channel:
        status = settings_service_pb2_grpc.SettingsServiceStub(channel).ServerStatus(
            settings_service_pb2.ServerStatusRequest()
        )
    target = ["--target", observed.target, "--channel", "status-cli"]

    assert main([*target, "status"]) == 0
    out = capsys.readouterr().out
    assert f"channels   {status.channels}" in out
    assert "open (no API keys), plaintext" in out
    assert "(384 dimensions)" in out
    assert "channel    status-cli" in out and "memories   1" in out

    assert main([*target, "status", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert int(document["total"]) == 1  # the channel's Identity, as before
    server = document["server"]
    assert int(server["channels"]) == status.channels
    assert int(server["memories_by_state"]["active"]) >= 1


def test_calor_serve_logs_json_and_serves_metrics(tmp_path: Path) -> None:
    metrics_port = free_port()
    process = CalorProcess(
        tmp_path / "data",
        tmp_path / "server.log",
        "--metrics-port",
        str(metrics_port),
        "--log-format",
        "json",
    )
    try:
        process.start()
        with grpc.insecure_channel(process.target) as channel:
            MemoryServiceStub(channel).Store(
                pb.StoreRequest(channel="proc", text="Quokka-secret 5512 stays out of logs.")
            )
        samples = scrape(metrics_port)
        assert calls(samples, STORE, "OK") == 1
        assert value(samples, "calor_memory_records", state="active") == 1
    finally:
        if process.process is not None and process.process.poll() is None:
            process.stop()
        process.close()
        if process.process is not None and process.process.stdout is not None:
            process.process.stdout.close()
    log = process.log_path.read_text()
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    assert any(line["message"].startswith("calor ready on") for line in lines)
    stores = [line for line in lines if line.get("rpc") == STORE]
    assert len(stores) == 1
    assert (stores[0]["status"], stores[0]["channel"]) == ("OK", "proc")
    assert "Quokka-secret" not in log and "5512" not in log


def test_under_access_control_refusals_are_counted_and_the_key_id_is_logged(
    start_server: Callable[..., ServerThread],
    tmp_path: Path,
    request_log: io.StringIO,
    capsys: pytest.CaptureFixture[str],
) -> None:
    keys = auth_file.KeyRing()
    admin, admin_token = auth_file.new_key("ops", Grants((parse_grant("*=read,write,admin"),)))
    agent, agent_token = auth_file.new_key("agent", Grants((parse_grant("team-a/*=read,write"),)))
    path = tmp_path / "keys.toml"
    auth_file.save(path, keys.with_key(admin).with_key(agent))
    server = start_server(auth_file=path, metrics_port=free_port())

    with grpc.insecure_channel(server.target) as channel:
        memories = MemoryServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            memories.Store(pb.StoreRequest(channel="team-a/x", text="No key, no entry."))
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        as_agent = (("authorization", f"Bearer {agent_token}"),)
        memories.Store(pb.StoreRequest(channel="team-a/x", text="A keyed note."), metadata=as_agent)
    samples = settled(
        lambda: scrape(server.server.metrics_port),
        lambda now: calls(now, STORE, "UNAUTHENTICATED") == 1,
    )
    assert calls(samples, STORE, "UNAUTHENTICATED") == 1
    assert calls(samples, STORE, "OK") == 1

    lines = [json.loads(line) for line in request_log.getvalue().splitlines()]
    keyed = [line for line in lines if line["rpc"] == STORE and line["status"] == "OK"]
    assert [line["key_id"] for line in keyed] == [agent.id]
    assert agent_token not in request_log.getvalue()

    target = ["--target", server.target, "--channel", "team-a/x"]
    assert main([*target, "--api-key", agent_token, "status"]) == 0  # no admin: channel only
    out = capsys.readouterr().out
    assert out.startswith("server     not shown: ") and "memories   1" in out
    assert main([*target, "--api-key", admin_token, "status"]) == 0
    out = capsys.readouterr().out
    assert "API keys required, plaintext" in out and "channels   1" in out


def test_counts_follow_decay_that_no_read_has_written_yet(
    start_server: Callable[..., ServerThread],
) -> None:
    clock = ManualClock(1_780_000_000.0)
    server = start_server(clock=clock, metrics_port=free_port())
    with grpc.insecure_channel(server.target) as channel:
        memories = MemoryServiceStub(channel)
        memories.Store(
            pb.StoreRequest(
                channel="fading",
                text="We had pizza at the offsite.",
                memory_type=memory_pb2.MEMORY_TYPE_EPISODIC,
            )
        )
        clock.advance(4 * 86_400)  # episodic: 2^-4 = 0.06, under the cold threshold
        status = settings_service_pb2_grpc.SettingsServiceStub(channel).ServerStatus(
            settings_service_pb2.ServerStatusRequest()
        )
        identity = memories.Identity(pb.IdentityRequest(channel="fading"))
    assert dict(status.memories_by_state) == {"cold": 1}
    assert dict(identity.by_state) == {"MEMORY_STATE_COLD": 1}
    assert value(scrape(server.server.metrics_port), "calor_memory_records", state="cold") == 1


def _record(memory_id: str, state: str = "active") -> MemoryRecord:
    return MemoryRecord(memory_id, "c", "text", "fact", 0.0, 0.0, 1.0, 0.0, state=state)


def test_a_record_table_counts_states_as_records_come_and_go() -> None:
    table = RecordTable()
    table["a"], table["b"] = _record("a"), _record("b")
    table["a"] = _record("a", "deleted")
    assert table.by_state == {"active": 1, "deleted": 1}
    table["c"] = _record("c", "cold")
    assert table.by_state == {"active": 1, "deleted": 1, "cold": 1}
    assert list(table) == ["a", "b", "c"] and table.ids_in(["cold", "active"]) == ["b", "c"]
    table.clear()
    assert table.by_state == {} and not table


def test_a_record_table_with_a_reader_keeps_the_recent_records_and_reads_the_rest() -> None:
    stored = {i: _record(i, "cold" if i == "e" else "active") for i in "abcde"}
    reads: list[str] = []

    def reader(memory_id: str) -> MemoryRecord | None:
        reads.append(memory_id)
        return stored.get(memory_id)

    table = RecordTable(reader=reader, cached=2)
    for memory_id, record in stored.items():
        table[memory_id] = record
    assert len(table) == 5 and table.by_state == {"active": 4, "cold": 1} and not reads
    assert table["a"] == stored["a"] and reads == ["a"], "a record not kept is read back"
    assert table["a"] is table["a"] and reads == ["a"], "then kept, as the latest used"
    assert table.state("b") == "active" and reads == ["a"], "a state needs no read"
    assert table.get("z") is None and "z" not in table and reads == ["a"], "nor does a stranger"
    assert [r.id for r in table.values()] == list("abcde")
    table.clear()
    reads.clear()
    assert table.get("a") is None and not reads, "a dropped channel reads nothing more"


def test_a_record_read_from_the_store_never_hides_a_change_made_during_the_read() -> None:
    """A reader without the channel's lock reads a record from RocksDB while a writer
    commits a change to it and applies it to the view: the view keeps the change (a
    forget must not come back as the live record read before it, nor a heat be lost)."""
    stored = {i: _record(i) for i in "ab"}
    meanwhile: list[Callable[[str], None]] = []  # what a writer does during the next read

    def reader(memory_id: str) -> MemoryRecord | None:
        before = stored.get(memory_id)
        while meanwhile:
            meanwhile.pop()(memory_id)
        return before

    def forget(memory_id: str) -> None:
        stored[memory_id] = _record(memory_id, "deleted")
        table[memory_id] = stored[memory_id]

    def heat(memory_id: str) -> None:
        stored[memory_id] = replace(stored[memory_id], heat0=0.9, t0=10.0)
        table.set_heats({memory_id: 0.9}, 10.0, 1)

    table = RecordTable(reader=reader, cached=1)
    table["a"], table["b"] = stored["a"], stored["b"]  # a is read from the store
    meanwhile.append(forget)
    assert table["a"].state == "active", "the reader gets what it read"
    assert table["a"].state == "deleted", "the view holds the forget, not the older read"
    assert table.by_state == {"active": 1, "deleted": 1}
    table["b"]  # b kept, a read from the store again
    meanwhile.append(heat)
    assert table["a"].heat0 == 1.0
    assert table["a"].heat0 == 0.9, "the heat written during the read is not lost"

"""Resume points the log cannot serve are refused with OUT_OF_RANGE, and the client's
subscriptions reconnect through outages for as long as they last, against real servers.
"""

from __future__ import annotations

import asyncio
import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from calor.client import Backoff, CalorClient, OutOfRangeError, _subscription
from calor.models.embedder import OnnxEmbedder
from calor.server.clock import SystemClock
from calor.server.config import ServerConfig
from calor.server.events import EventRecord
from calor.triggers.subscriptions import EventFilter, SubscriptionHub
from calor.v1 import trigger_service_pb2 as tpb
from calor.v1.trigger_service_pb2_grpc import TriggerServiceStub
from tests.conftest import ServerThread
from tests.helpers import Run

OUT_OF_RANGE = grpc.StatusCode.OUT_OF_RANGE
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


def log_notes(server: ServerThread, channel: str, *messages: str) -> None:
    """Log one notify event per message, as a trigger would."""
    server.server.runtime.engine.log(
        *(EventRecord(kind="notify", channel=channel, at=time.time(), message=m) for m in messages)
    )


def take(stub: TriggerServiceStub, request: tpb.SubscribeRequest, count: int) -> list[tpb.Event]:
    """The first ``count`` events a fresh Subscribe call streams."""
    call = stub.Subscribe(request, timeout=10)
    try:
        return [next(call).event for _ in range(count)]
    finally:
        call.cancel()


def refusal(stub: TriggerServiceStub, request: tpb.SubscribeRequest) -> grpc.RpcError:
    """The status a Subscribe call ends with before streaming anything."""
    call = stub.Subscribe(request, timeout=10)
    with pytest.raises(grpc.RpcError) as caught:
        next(call)
    return caught.value


def trailing(error: grpc.RpcError) -> dict[str, str]:
    return dict(error.trailing_metadata() or ())  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def pruned(start_server: Callable[..., ServerThread]) -> Iterator[tuple[ServerThread, list[int]]]:
    """A server whose log keeps 5 events, after 12 were logged: (server, retained seqs)."""
    server = start_server(event_retention=5)
    log_notes(server, "kept", *(f"note {n}" for n in range(12)))
    with grpc.insecure_channel(server.target) as channel:
        stub = TriggerServiceStub(channel)
        deadline = time.time() + 10
        while True:  # the dispatcher trims the log once it has handled the events
            retained = [e.seq for e in take(stub, tpb.SubscribeRequest(channels=["kept"]), 5)]
            if retained[0] > 1 or time.time() > deadline:
                break
            time.sleep(0.05)
    assert retained == list(range(retained[0], retained[0] + 5)) and retained[0] > 2
    yield server, retained


# --- the server's answers -----------------------------------------------------------------


def test_after_seq_beyond_the_end_is_out_of_range_naming_the_last_seq(
    start_server: Callable[..., ServerThread],
) -> None:
    server = start_server()
    log_notes(server, "end", "one", "two", "three")
    with grpc.insecure_channel(server.target) as channel:
        stub = TriggerServiceStub(channel)
        last = take(stub, tpb.SubscribeRequest(channels=["end"]), 3)[-1].seq
        error = refusal(stub, tpb.SubscribeRequest(channels=["end"], after_seq=last + 40))
    assert error.code() == OUT_OF_RANGE
    assert f"its last sequence is {last}" in (error.details() or "")
    assert trailing(error)["calor-log-last-seq"] == str(last)
    with CalorClient(server.target, channel="end") as client:
        with pytest.raises(OutOfRangeError) as caught:
            next(client.subscribe(after_seq=last + 1))
    assert (caught.value.last_seq, caught.value.oldest_seq) == (last, None)


def test_after_seq_at_the_last_seq_waits_for_new_events(
    start_server: Callable[..., ServerThread],
) -> None:
    server = start_server()
    log_notes(server, "tail", "old")
    with grpc.insecure_channel(server.target) as channel:
        stub = TriggerServiceStub(channel)
        last = take(stub, tpb.SubscribeRequest(channels=["tail"]), 1)[0].seq
        call = stub.Subscribe(tpb.SubscribeRequest(channels=["tail"], after_seq=last), timeout=10)
        log_notes(server, "tail", "new", "newer")
        events = [next(call).event for _ in range(2)]
        call.cancel()
    assert [(e.seq, e.message) for e in events] == [(last + 1, "new"), (last + 2, "newer")]


def test_until_seq_ends_the_stream_after_a_window_of_history(
    start_server: Callable[..., ServerThread],
) -> None:
    server = start_server()
    log_notes(server, "window", "a", "b", "c", "d")
    log_notes(server, "elsewhere", "e")
    log_notes(server, "window", "f")
    with grpc.insecure_channel(server.target) as channel:
        stub = TriggerServiceStub(channel)
        seqs = [e.seq for e in take(stub, tpb.SubscribeRequest(channels=["window"]), 5)]
        window = tpb.SubscribeRequest(channels=["window"], after_seq=seqs[0], until_seq=seqs[3])
        assert [e.event.message for e in stub.Subscribe(window, timeout=10)] == ["b", "c", "d"]
        end = seqs[-1] - 1  # the other channel's event: nothing of the window's comes after
        up_to = tpb.SubscribeRequest(channels=["window"], until_seq=end)
        assert [e.event.message for e in stub.Subscribe(up_to, timeout=10)] == list("abcd")
        error = refusal(stub, tpb.SubscribeRequest(channels=["window"], until_seq=seqs[-1] + 9))
    assert error.code() == OUT_OF_RANGE
    assert f"until_seq={seqs[-1] + 9} is beyond the end" in (error.details() or "")
    with CalorClient(server.target, channel="window") as client:
        events = client.subscribe(after_seq=0, until_seq=seqs[2])
        assert [event.message for event in events] == ["a", "b", "c"]


def test_a_resume_point_older_than_retained_is_out_of_range_naming_the_oldest(
    pruned: tuple[ServerThread, list[int]],
) -> None:
    server, retained = pruned
    oldest = retained[0]
    with grpc.insecure_channel(server.target) as channel:
        stub = TriggerServiceStub(channel)
        error = refusal(stub, tpb.SubscribeRequest(channels=["kept"], after_seq=oldest - 2))
        # One before the oldest retained misses nothing.
        resumed = take(stub, tpb.SubscribeRequest(channels=["kept"], after_seq=oldest - 1), 5)
    assert error.code() == OUT_OF_RANGE
    assert f"the oldest retained sequence is {oldest}" in (error.details() or "")
    assert trailing(error)["calor-log-oldest-seq"] == str(oldest)
    assert [e.seq for e in resumed] == retained
    with CalorClient(server.target, channel="kept") as client:
        with pytest.raises(OutOfRangeError) as caught:
            next(client.subscribe(channels=["kept"], after_seq=1))
    assert (caught.value.last_seq, caught.value.oldest_seq) == (None, oldest)


def test_from_oldest_retained_starts_at_the_oldest_retained(
    pruned: tuple[ServerThread, list[int]],
) -> None:
    server, retained = pruned
    wanted = tpb.SubscribeRequest(channels=["kept"], after_seq=1, from_oldest_retained=True)
    with grpc.insecure_channel(server.target) as channel:
        replayed = take(TriggerServiceStub(channel), wanted, 5)
    assert [e.seq for e in replayed] == retained
    with CalorClient(server.target, channel="kept") as client:
        with client.subscribe(channels=["kept"], after_seq=1, from_oldest_retained=True) as events:
            assert [next(events).message for _ in range(5)] == [f"note {n}" for n in range(7, 12)]


def test_after_seq_zero_still_means_everything_retained(
    pruned: tuple[ServerThread, list[int]],
) -> None:
    server, retained = pruned
    with grpc.insecure_channel(server.target) as channel:
        replayed = take(TriggerServiceStub(channel), tpb.SubscribeRequest(channels=["kept"]), 5)
    assert [e.seq for e in replayed] == retained


# --- the client through an outage ---------------------------------------------------------


class Reader:
    """A client subscription read on a thread into a queue."""

    def __init__(self, stream: Iterator[tpb.Event]) -> None:
        self.events: queue.Queue[tpb.Event] = queue.Queue()
        self.error: BaseException | None = None
        self._stream = stream
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for event in self._stream:
                self.events.put(event)
        except BaseException as error:  # handed to the test
            self.error = error

    def take(self, count: int, timeout: float = 20.0) -> list[tpb.Event]:
        try:
            return [self.events.get(timeout=timeout) for _ in range(count)]
        except queue.Empty:
            ended = f"the stream ended: {self.error!r}"
            raise AssertionError(f"no event in {timeout} s; {ended}") from None

    def join(self) -> None:
        self._thread.join(10)


@pytest.mark.timeout(180)
def test_the_client_reconnects_through_an_outage_longer_than_ten_attempts(
    embedder: OnnxEmbedder, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="calor.client.subscribe")
    first = ServerThread(ServerConfig(data_dir=tmp_path, port=0), SystemClock(), lambda: embedder)
    port = first.port
    second: ServerThread | None = None
    client = CalorClient(first.target, channel="away")
    # A tiny cap packs dozens of attempts into a few seconds of outage.
    stream = client.subscribe(
        channels=["away"], backoff=Backoff(initial=0.01, maximum=0.05, reset_after=60.0)
    )
    reader = Reader(stream)
    try:
        log_notes(first, "away", "before 1", "before 2")
        before = reader.take(2)
        first.stop()
        time.sleep(4.0)
        config = ServerConfig(data_dir=tmp_path, host="127.0.0.1", port=port)
        second = ServerThread(config, SystemClock(), lambda: embedder)
        log_notes(second, "away", "after 1", "after 2", "after 3")
        after = reader.take(3)
    finally:
        stream.close()
        reader.join()
        client.close()
        if second is not None:
            second.stop()
    assert reader.error is None
    assert [e.message for e in before + after] == [
        "before 1",
        "before 2",
        "after 1",
        "after 2",
        "after 3",
    ]
    seqs = [e.seq for e in before + after]
    assert seqs == list(range(seqs[0], seqs[0] + 5))
    retries = [r for r in caplog.records if "resubscribing" in r.getMessage()]
    assert len(retries) > 10, "the outage outlasted the old budget of 10 attempts"


# --- the backoff schedule -------------------------------------------------------------------


def test_the_default_backoff_is_unbounded_jittered_and_capped() -> None:
    backoff = Backoff()
    assert backoff.attempts is None
    assert backoff.maximum <= 30.0
    waits = [backoff.delay(n) for n in range(1, 10_001)]
    assert all(0.0 < w <= backoff.maximum for w in waits)
    late = waits[100:]
    assert min(late) >= backoff.maximum * (1 - backoff.jitter) and backoff.jitter > 0
    assert len({round(w, 6) for w in late}) > 100, "the waits are drawn, not fixed"
    assert backoff.delay(1, draw=lambda: 0.0) == backoff.initial
    assert backoff.delay(2, draw=lambda: 0.0) == 2 * backoff.initial
    assert backoff.delay(50, draw=lambda: 0.0) == backoff.maximum
    assert Backoff(jitter=0.0).delay(3) == 4 * Backoff().initial

    resumer = _subscription.Resumer(tpb.SubscribeRequest(after_seq=3))
    down = FakeUnavailable()
    assert all(resumer.retry_delay(down) is not None for _ in range(1_000))
    assert resumer.failures == 1_000


def test_an_attempt_limit_is_an_option() -> None:
    resumer = _subscription.Resumer(tpb.SubscribeRequest(), backoff=Backoff(attempts=3))
    down = FakeUnavailable()
    assert [resumer.retry_delay(down) is not None for _ in range(4)] == [True] * 3 + [False]


def test_from_oldest_retained_is_asked_only_until_an_event_arrives() -> None:
    request = tpb.SubscribeRequest(after_seq=4, from_oldest_retained=True)
    resumer = _subscription.Resumer(request)
    assert resumer.request().from_oldest_retained
    assert resumer.accept(tpb.SubscribeResponse(event=tpb.Event(seq=9)))
    again = resumer.request()
    assert (again.after_seq, again.from_oldest_retained) == (9, False)


def test_a_stream_from_now_leaves_out_an_event_committed_before_it_not_yet_published() -> None:
    """A store is acknowledged once its event is committed; the event reaches the
    subscribers' loop moments later. A stream opened "from now" in between starts after
    it, so a client never hears of a write it was told of before subscribing."""
    logged = [EventRecord("on_store", "c", 0.0).with_seq(n) for n in (1, 2, 3)]

    async def read_after(seq: int, limit: int) -> list[EventRecord]:
        return [e for e in logged if e.seq > seq][:limit]

    async def scenario() -> list[int]:
        hub = SubscriptionHub(read_after, last_logged=lambda: logged[-2].seq)
        hub.publish(logged[:1])  # event 2 is committed, not yet published
        now = await hub.last_seq()
        stream = hub.subscribe(EventFilter(), after_seq=now)
        first = asyncio.ensure_future(anext(stream))
        await asyncio.sleep(0)
        hub.publish(logged[1:])  # 2 arrives late, then 3 is stored after the subscription
        seen = [(await first).seq]
        await stream.aclose()
        return [now, *seen]

    assert asyncio.run(scenario()) == [2, 3]


class FakeUnavailable(grpc.RpcError):
    """A call that failed because no server answered."""

    def code(self) -> grpc.StatusCode:
        return UNAVAILABLE

    def details(self) -> str:
        return "connection refused"

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return ()


def test_cli_subscribe_beyond_the_end_fails_naming_the_last_seq(calor: Run) -> None:
    status, out, err = calor("subscribe", "--after-seq", str(10**12), "--max-attempts", "3")
    assert (status, out) == (1, "")
    assert "OUT_OF_RANGE" in err and "its last sequence is" in err


def test_cli_subscribe_until_seq_prints_a_window_and_ends(calor: Run, channel_name: str) -> None:
    for n in range(3):
        assert calor("store", f"Window note {n}.")[0] == 0
    status, out, _ = calor("--json", "subscribe", "--after-seq", "0", "--kind", "on_store",
                           "--max-events", "3")  # fmt: skip
    seqs = [json.loads(line)["seq"] for line in out.splitlines()]
    status, out, _ = calor("subscribe", "--after-seq", str(seqs[0]), "--until-seq", str(seqs[1]))
    assert status == 0 and len(out.splitlines()) == 1 and str(seqs[1]) in out

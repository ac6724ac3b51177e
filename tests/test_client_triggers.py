"""Triggers and event subscriptions through the clients and the CLI, against a real server.

The resume logic of ``subscribe`` is also checked against a fake stub at the network
seam: a stream that ends with RESOURCE_EXHAUSTED or UNAVAILABLE once, or for ever.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from calor.client import (
    AsyncCalorClient,
    CalorClient,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
    UnavailableError,
    _subscription,
)
from calor.client._subscription import Backoff
from calor.v1 import trigger_service_pb2 as tpb
from tests.helpers import Run

ON_STORE = tpb.EVENT_KIND_ON_STORE
NOTIFY = tpb.EVENT_KIND_NOTIFY


def _history(client: CalorClient, trigger_id: str, count: int) -> list[tpb.TriggerFiring]:
    """The trigger's history once it holds ``count`` firings (it is written after the
    action's event is logged, so it may lag the stream a little)."""
    deadline = time.monotonic() + 10.0
    while True:
        firings = client.trigger_history(trigger_id)
        if len(firings) >= count or time.monotonic() > deadline:
            return firings
        time.sleep(0.05)


# --- against the real server ------------------------------------------------------------


def test_notify_trigger_streams_store_and_notify_events_in_order(
    client: CalorClient, channel_name: str
) -> None:
    trigger = client.create_trigger(
        event="on_store",
        action="notify",
        trigger_id=f"{channel_name[:50]}:notify",
        config={"message": "noted {memory_id}"},
    )
    assert trigger.id == f"{channel_name[:50]}:notify"
    assert (trigger.event, trigger.action, trigger.channel) == (
        ON_STORE,
        tpb.ACTION_KIND_NOTIFY,
        channel_name,
    )

    events = client.subscribe(channels=[channel_name], kinds=["on_store", "notify"])
    with ThreadPoolExecutor(max_workers=1) as pool:
        received = pool.submit(lambda: list(itertools.islice(events, 6)))
        ids = [client.store(f"Note number {n} about the launch.").id for n in range(3)]
        got = received.result(timeout=30)
    events.close()

    seqs = [e.seq for e in got]
    assert seqs == sorted(set(seqs)), "each event once, in seq order"
    assert events.last_seq == seqs[-1]
    stores = [e for e in got if e.kind == ON_STORE]
    notes = [e for e in got if e.kind == NOTIFY]
    assert [e.memory_id for e in stores] == ids
    assert [e.memory_id for e in notes] == ids
    assert all(e.channel == channel_name for e in got)
    assert all(e.trigger_id == trigger.id for e in notes)
    assert [e.message for e in notes] == [f"noted {i}" for i in ids]
    assert all(note.seq > store.seq for store, note in zip(stores, notes, strict=True))

    firings = _history(client, trigger.id, 3)
    assert [f.memory_id for f in firings] == ids
    assert [f.seq for f in firings] == [e.seq for e in stores]
    assert all(f.trigger_id == trigger.id and f.outcome for f in firings)
    assert client.list_triggers()[0].fires == 3
    latest = client.trigger_history(trigger.id, latest=2)
    assert [f.memory_id for f in latest] == ids[:0:-1]  # the two newest, newest first


def test_subscribe_after_seq_resumes_where_asked(client: CalorClient, channel_name: str) -> None:
    for n in range(3):
        client.store(f"Fact {n}: the office moved.")
    with client.subscribe(kinds=[ON_STORE], after_seq=0) as events:
        first = list(itertools.islice(events, 3))
    with client.subscribe(
        channels=channel_name, kinds="on_store", after_seq=first[0].seq
    ) as events:
        rest = list(itertools.islice(events, 2))
    assert [e.seq for e in rest] == [e.seq for e in first[1:]]


def test_list_and_delete_triggers(client: CalorClient, channel_name: str) -> None:
    given = client.create_trigger(
        event="on_recall",
        action="boost",
        trigger_id=f"{channel_name[:50]}.boost",
        config={"delta": "0.1"},
        filter_memory_type="fact",
        filter_pattern="(?i)peanut",
        filter_heat_above=0.2,
        max_fires=5,
        cooldown_seconds=1.5,
    )
    chosen = client.create_trigger(event=tpb.EVENT_KIND_ON_STORE, action=tpb.ACTION_KIND_NOTIFY)
    assert chosen.id and chosen.id != given.id

    listed = {t.id: t for t in client.list_triggers()}
    assert set(listed) == {given.id, chosen.id}
    kept = listed[given.id]
    assert dict(kept.config) == {"delta": "0.1"}
    assert (kept.filter_pattern, kept.max_fires, kept.cooldown_seconds) == ("(?i)peanut", 5, 1.5)
    assert kept.HasField("filter_heat_above") and not kept.HasField("filter_heat_below")
    assert {given.id, chosen.id} <= {t.id for t in client.list_triggers(channel="")}

    client.delete_trigger(given.id)
    assert [t.id for t in client.list_triggers()] == [chosen.id]
    with pytest.raises(NotFoundError):
        client.delete_trigger(given.id)
    assert client.trigger_history(chosen.id) == []


def test_evaluate_triggers_reports_the_trigger(client: CalorClient) -> None:
    memory = client.store("The deadline for the grant report is Friday.", memory_type="fact")
    hit = client.create_trigger(event="on_store", action="notify", filter_pattern="(?i)deadline")
    client.create_trigger(event="on_store", action="notify", filter_pattern="(?i)birthday")
    client.create_trigger(event="on_recall", action="notify")

    matches = client.evaluate_triggers("on_store", memory.id)
    assert [m.trigger.id for m in matches] == [hit.id]
    assert matches[0].would
    assert client.evaluate_triggers("on_boost", memory.id) == []
    with pytest.raises(NotFoundError):
        client.evaluate_triggers("on_store", "01JD0000000000000000000000")


def test_bad_trigger_arguments_are_refused(client: CalorClient) -> None:
    with pytest.raises(InvalidArgumentError, match="action kind"):
        client.create_trigger(event="on_store", action="explode")
    with pytest.raises(InvalidArgumentError, match="trigger.id"):
        client.create_trigger(event="on_store", action="notify", trigger_id="no spaces!")
    with pytest.raises(TypeError, match="pattern"):
        client.create_trigger(event="on_store", action="notify", pattern="x")  # type: ignore[call-arg]
    with pytest.raises(InvalidArgumentError, match="event kind"):
        client.subscribe(kinds=["on_explode"])
    with pytest.raises(InvalidArgumentError, match="after_seq"):
        client.subscribe(after_seq=-1)
    assert client.list_triggers() == []


def test_async_client_triggers_and_subscribe(calor_target: str, channel_name: str) -> None:
    async def scenario() -> None:
        async with AsyncCalorClient(calor_target, channel=channel_name) as calor:
            trigger = await calor.create_trigger(event="on_store", action="notify")
            ids = [(await calor.store(f"Async note {n}.")).id for n in range(2)]
            stream = calor.subscribe(trigger_ids=[trigger.id], after_seq=0)
            got = [event async for event in _take(stream, 2)]
            await stream.aclose()
            assert [e.memory_id for e in got] == ids
            assert {e.kind for e in got} == {NOTIFY}
            assert [t.id for t in await calor.list_triggers()] == [trigger.id]
            matches = await calor.evaluate_triggers("on_store", ids[0])
            assert [m.trigger.id for m in matches] == [trigger.id]
            for _ in range(200):
                if len(await calor.trigger_history(trigger.id)) == 2:
                    break
                await asyncio.sleep(0.05)
            assert [f.memory_id for f in await calor.trigger_history(trigger.id)] == ids
            await calor.delete_trigger(trigger.id)
            assert await calor.list_triggers() == []

    asyncio.run(scenario())


async def _take(stream: AsyncIterator[tpb.Event], count: int) -> AsyncIterator[tpb.Event]:
    """The first ``count`` events of a stream."""
    if count <= 0:
        return
    seen = 0
    async for event in stream:
        yield event
        seen += 1
        if seen >= count:
            return


# --- the CLI ----------------------------------------------------------------------------


def test_cli_trigger_add_list_history_rm(calor: Run, channel_name: str) -> None:
    trigger_id = f"{channel_name[:50]}-cli"
    status, out, err = calor(
        "trigger",
        "add",
        "--event",
        "on_store",
        "--action",
        "notify",
        "--config",
        "message=saw {memory_id}",
        "--pattern",
        "(?i)standup",
        "--id",
        trigger_id,
        "--max-fires",
        "3",
    )
    assert (status, err) == (0, "")
    assert out.startswith(f"created {trigger_id}  on_store -> notify  in {channel_name}")

    status, out, _ = calor("trigger", "list", "--json")
    assert status == 0
    (listed,) = json.loads(out)["triggers"]
    assert listed["id"] == trigger_id
    assert listed["event"] == "EVENT_KIND_ON_STORE"
    assert listed["config"] == {"message": "saw {memory_id}"}
    assert int(listed["max_fires"]) == 3

    memory_id = calor("store", "Standup moved to 10:00.")[1].split()[1]
    for _ in range(200):
        status, out, _ = calor("trigger", "history", trigger_id)
        if memory_id in out:
            break
        time.sleep(0.05)
    assert status == 0
    assert memory_id in out and out.startswith("#")

    assert calor("trigger", "rm", trigger_id)[:2] == (0, f"deleted trigger {trigger_id}\n")
    status, out, err = calor("trigger", "rm", trigger_id)
    assert (status, out) == (1, "")
    assert err.startswith("error: NOT_FOUND: ")
    assert calor("trigger", "list")[1] == "no triggers\n"


def test_cli_trigger_add_rejects_an_unknown_action(calor: Run) -> None:
    status, out, err = calor("trigger", "add", "--event", "on_store", "--action", "explode")
    assert (status, out) == (2, "")
    assert "invalid choice" in err


def test_cli_subscribe_prints_events_after_seq(
    calor: Run, client: CalorClient, channel_name: str
) -> None:
    ids = [client.store(f"Item {n} for the shopping list.").id for n in range(3)]
    status, out, _ = calor(
        "subscribe", "--kind", "on_store", "--after-seq", "0", "--max-events", "3", "--json"
    )
    assert status == 0
    events = [json.loads(line) for line in out.splitlines()]
    assert [e["memory_id"] for e in events] == ids
    assert all(e["kind"] == "EVENT_KIND_ON_STORE" for e in events)
    first = int(events[0]["seq"])

    status, out, _ = calor(
        "subscribe", "--kind", "on_store", "--after-seq", str(first), "--max-events", "2"
    )
    assert status == 0
    lines = out.splitlines()
    assert len(lines) == 2
    for line, event in zip(lines, events[1:], strict=True):
        seq, kind, channel, memory_id, trigger = line.split()[:5]
        assert (seq, kind, channel, memory_id, trigger) == (
            f"#{event['seq']}",
            "on_store",
            channel_name,
            event["memory_id"],
            "-",
        )


def test_cli_subscribe_rejects_a_negative_after_seq(calor: Run) -> None:
    status, out, err = calor("subscribe", "--after-seq", "-1")
    assert (status, out) == (2, "")
    assert err.startswith("error: INVALID_ARGUMENT: after_seq")


def test_cli_subscribe_ctrl_c_exits_0(calor: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*args: Any, **kwargs: Any) -> Iterator[tpb.Event]:
        raise KeyboardInterrupt

    monkeypatch.setattr(_subscription.EventStream, "__next__", interrupted)
    assert calor("subscribe")[:2] == (0, "")


# --- resuming, against a fake stub --------------------------------------------------------


class FakeRpcError(grpc.RpcError):
    """A failed call as grpc raises it: a status code, details and trailing metadata."""

    def __init__(self, code: grpc.StatusCode, details: str = "", last_seq: int | None = None):
        super().__init__(details)
        self._code = code
        self._details = details
        self._trailing: tuple[tuple[str, str | bytes], ...] = ()
        if last_seq is not None:
            self._trailing = (("calor-last-seq", str(last_seq)),)

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> Any:  # the stubs name a private type
        return self._trailing


Script = tuple[Sequence[int], FakeRpcError | None]
"""One call's behaviour: the seqs it streams, then the error it ends with (None: ends)."""


class FakeCall:
    """A server-streaming call that plays one :data:`Script`."""

    def __init__(self, script: Script) -> None:
        seqs, self._error = script
        self._responses = iter(
            [tpb.SubscribeResponse(event=tpb.Event(seq=s, kind=ON_STORE)) for s in seqs]
        )
        self.cancelled = False

    def __next__(self) -> tpb.SubscribeResponse:
        for response in self._responses:
            return response
        if self._error is not None:
            raise self._error
        raise StopIteration

    def cancel(self) -> bool:
        self.cancelled = True
        return True

    def __aiter__(self) -> AsyncIterator[tpb.SubscribeResponse]:
        return self._aiter()

    async def _aiter(self) -> AsyncIterator[tpb.SubscribeResponse]:
        while True:
            try:
                response = next(self)
            except StopIteration:
                return
            yield response


class FakeTriggerStub:
    """Stands in for the TriggerService stub: each Subscribe plays the next script."""

    def __init__(self, scripts: Sequence[Script]) -> None:
        self._scripts = iter(scripts)
        self.requests: list[tpb.SubscribeRequest] = []
        self.calls: list[FakeCall] = []

    def Subscribe(self, request: tpb.SubscribeRequest, timeout: float | None = None) -> FakeCall:
        assert timeout is None, "a subscription has no deadline"
        self.requests.append(request)
        self.calls.append(FakeCall(next(self._scripts)))
        return self.calls[-1]


EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


@pytest.fixture
def no_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_subscription, "BACKOFF", Backoff(initial=0.0, maximum=0.0))


def _fake_client(stub: FakeTriggerStub) -> CalorClient:
    client = CalorClient("127.0.0.1:1", channel="fake")
    client._triggers = stub  # type: ignore[assignment]
    return client


@pytest.mark.usefixtures("no_waiting")
def test_subscribe_resumes_after_resource_exhausted_without_loss_or_repeat() -> None:
    behind = FakeRpcError(EXHAUSTED, "fell behind; resume with after_seq=3", last_seq=3)
    stub = FakeTriggerStub([([1, 2, 3], behind), ([3, 4, 5], None)])
    with _fake_client(stub) as client:
        events = client.subscribe(channels=["a"], kinds=["notify"], after_seq=0)
        assert [e.seq for e in events] == [1, 2, 3, 4, 5]
    assert [r.after_seq for r in stub.requests] == [0, 3]
    assert all(list(r.channels) == ["a"] and list(r.kinds) == [NOTIFY] for r in stub.requests)
    assert events.closed


@pytest.mark.usefixtures("no_waiting")
def test_a_stream_the_server_cancels_is_resumed() -> None:
    """A server that stops cancels the streams still open when its grace ends (a
    resubscription that reached it while it was stopping): resume, nothing lost."""
    cancelled = FakeRpcError(grpc.StatusCode.CANCELLED, "Received RST_STREAM with error code 8")
    stub = FakeTriggerStub([([1, 2], cancelled), ((), cancelled), ([3], None)])
    with _fake_client(stub) as client:
        assert [e.seq for e in client.subscribe(after_seq=0)] == [1, 2, 3]
    assert [r.after_seq for r in stub.requests] == [0, 2, 2]


def test_subscribe_gives_up_after_its_attempt_limit_in_a_row() -> None:
    down = FakeRpcError(UNAVAILABLE, "connection refused")
    stub = FakeTriggerStub([([7], down), *[((), down)] * 10])
    with _fake_client(stub) as client:
        events = client.subscribe(
            after_seq=6, backoff=Backoff(initial=0.0, maximum=0.0, attempts=10)
        )
        assert next(events).seq == 7
        with pytest.raises(UnavailableError, match="connection refused"):
            next(events)
    assert len(stub.requests) == 11  # the first call, then 10 retries that all failed
    assert {r.after_seq for r in stub.requests[1:]} == {7}
    with pytest.raises(StopIteration):
        next(events)


@pytest.mark.usefixtures("no_waiting")
def test_progress_between_failures_resets_the_count() -> None:
    down = FakeRpcError(UNAVAILABLE, "restarting")
    stub = FakeTriggerStub([([n], down) for n in range(1, 16)] + [((), None)])
    with _fake_client(stub) as client:
        assert [e.seq for e in client.subscribe(after_seq=0)] == list(range(1, 16))


def test_a_stream_that_stayed_open_a_while_resets_the_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [1000.0]
    monkeypatch.setattr(_subscription, "time", SimpleNamespace(monotonic=lambda: now[0]))
    resumer = _subscription.Resumer(tpb.SubscribeRequest(), backoff=Backoff(attempts=2, jitter=0.0))
    down = FakeRpcError(UNAVAILABLE, "restarting")

    def fail(after: float) -> float | None:
        resumer.opened()
        now[0] += after
        return resumer.retry_delay(down)

    assert [fail(0.0), fail(1.0)] == [0.2, 0.4]
    assert fail(10.0) == 0.2  # that call stayed open 10 s, quiet, before it failed
    assert [fail(0.0), fail(9.0)] == [0.4, None]


def test_subscribe_without_resume_raises_and_other_codes_are_not_resumed() -> None:
    behind = FakeRpcError(EXHAUSTED, "fell behind", last_seq=1)
    with _fake_client(FakeTriggerStub([([1], behind)])) as client:
        events = client.subscribe(resume=False, after_seq=0)
        assert next(events).seq == 1
        with pytest.raises(ResourceExhaustedError):
            next(events)
    bad = FakeRpcError(grpc.StatusCode.INVALID_ARGUMENT, "channels: bad name")
    with _fake_client(FakeTriggerStub([((), bad)])) as client:
        with pytest.raises(InvalidArgumentError, match="bad name"):
            list(client.subscribe(after_seq=0))


def test_backoff_doubles_from_a_fifth_of_a_second_up_to_ten_before_jitter() -> None:
    delays = [Backoff().delay(n, draw=lambda: 0.0) for n in range(1, 9)]
    assert delays == [0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 10.0, 10.0]


def test_close_from_another_thread_cancels_a_blocked_call() -> None:
    class BlockingCall:
        def __init__(self) -> None:
            self.cancelled = threading.Event()

        def __next__(self) -> tpb.SubscribeResponse:
            if not self.cancelled.wait(10):
                raise AssertionError("not cancelled")
            raise FakeRpcError(grpc.StatusCode.CANCELLED, "Locally cancelled by application!")

        def cancel(self) -> bool:
            self.cancelled.set()
            return True

    call = BlockingCall()
    events = _subscription.EventStream(
        lambda request: call, _subscription.Resumer(tpb.SubscribeRequest())
    )
    threading.Timer(0.1, events.close).start()
    assert list(events) == []
    assert call.cancelled.is_set()


@pytest.mark.usefixtures("no_waiting")
def test_async_subscribe_resumes_and_cancels_its_calls() -> None:
    behind = FakeRpcError(EXHAUSTED, "fell behind", last_seq=2)
    stub = FakeTriggerStub([([1, 2], behind), ([2, 3], FakeRpcError(UNAVAILABLE)), ([4], None)])

    async def scenario() -> list[int]:
        client = AsyncCalorClient("127.0.0.1:1", channel="fake")
        client._triggers = stub  # type: ignore[assignment]
        try:
            return [event.seq async for event in client.subscribe(kinds=[ON_STORE], after_seq=0)]
        finally:
            await client.close()

    assert asyncio.run(scenario()) == [1, 2, 3, 4]
    assert [r.after_seq for r in stub.requests] == [0, 2, 3]
    assert all(call.cancelled for call in stub.calls)

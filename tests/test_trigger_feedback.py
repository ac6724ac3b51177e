"""Trigger feedback (issue 34, point 3): a firing is rated useful or noise by the seq of the
event that caused it; each trigger carries its precision over the last 30 days in
ListTriggers and TriggerHistory; one whose precision over 20 or more rated firings falls
under the channel's trigger_min_precision is flagged, and with trigger_auto_pause it is
paused, with an event saying why, and fires no more."""

from __future__ import annotations

import time

import grpc
import pytest

from calor.v1 import trigger_service_pb2 as tpb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from calor.v1.trigger_service_pb2_grpc import TriggerServiceStub
from tests.helpers import store, update_settings

USEFUL, NOISE = tpb.TRIGGER_RATING_USEFUL, tpb.TRIGGER_RATING_NOISE


def firings(
    triggers: TriggerServiceStub, channel: str, trigger_id: str, count: int
) -> list[tpb.TriggerFiring]:
    """The trigger's history once it holds ``count`` firings (the engine fires after the
    store is acknowledged)."""
    deadline = time.monotonic() + 10
    while True:
        history = triggers.TriggerHistory(
            tpb.TriggerHistoryRequest(channel=channel, trigger_id=trigger_id, page_size=1000)
        )
        if len(history.firings) >= count or time.monotonic() > deadline:
            return list(history.firings)
        time.sleep(0.05)


def rate(
    triggers: TriggerServiceStub, channel: str, trigger_id: str, seq: int, rating: int
) -> tpb.Trigger:
    request = tpb.TriggerFeedbackRequest(
        channel=channel, trigger_id=trigger_id, cause_seq=seq, rating=rating
    )
    return triggers.TriggerFeedback(request).trigger


def test_ratings_give_precision_flag_and_with_auto_pause_pause_the_trigger(
    memories: MemoryServiceStub, grpc_channel: grpc.Channel, channel_name: str
) -> None:
    triggers = TriggerServiceStub(grpc_channel)
    update_settings(grpc_channel, channel_name, trigger_min_precision=0.6, trigger_auto_pause=True)
    rule = tpb.Trigger(
        id="noisy",
        channel=channel_name,
        event=tpb.EVENT_KIND_ON_STORE,
        action=tpb.ACTION_KIND_NOTIFY,
        config={"message": "stored: {text}"},
    )
    triggers.CreateTrigger(tpb.CreateTriggerRequest(trigger=rule))
    for n in range(22):
        store(memories, channel_name, f"Reading number {n} from the hallway sensor.")
    fired = firings(triggers, channel_name, "noisy", 22)
    assert len(fired) == 22

    # Eight useful, eleven noise: 19 rated, not yet enough to flag (precision 0.42).
    for position, firing in enumerate(fired[:19]):
        now = rate(triggers, channel_name, "noisy", firing.seq, USEFUL if position < 8 else NOISE)
    assert (now.rated, now.flagged, now.paused) == (19, False, "")
    assert now.precision == pytest.approx(8 / 19)
    # Rating one again replaces its rating.
    now = rate(triggers, channel_name, "noisy", fired[0].seq, NOISE)
    assert now.rated == 19 and now.precision == pytest.approx(7 / 19)
    history = triggers.TriggerHistory(
        tpb.TriggerHistoryRequest(channel=channel_name, trigger_id="noisy", page_size=1000)
    )
    assert [f.rating for f in history.firings[:9]] == ["noise"] + ["useful"] * 7 + ["noise"]
    assert history.firings[20].rating == "" and history.rated == 19
    assert history.precision == pytest.approx(7 / 19)

    # The twentieth rating flags it; auto-pause pauses it, with an event saying why.
    now = rate(triggers, channel_name, "noisy", fired[19].seq, NOISE)
    assert now.flagged and now.rated == 20 and "precision 0.35" in now.paused
    listed = triggers.ListTriggers(tpb.ListTriggersRequest(channel=channel_name)).triggers
    assert [(t.id, t.flagged, bool(t.paused)) for t in listed] == [("noisy", True, True)]
    events = triggers.Subscribe(
        tpb.SubscribeRequest(channels=[channel_name], kinds=[tpb.EVENT_KIND_NOTIFY]), timeout=5
    )
    paused_events = []
    try:
        for reply in events:
            if reply.event.payload.get("paused") == "true":
                paused_events.append(reply.event)
                break
    except grpc.RpcError:
        pass
    events.cancel()
    assert paused_events and paused_events[0].trigger_id == "noisy"
    assert "precision 0.35" in paused_events[0].message

    # Paused, it fires no more.
    store(memories, channel_name, "One more reading from the hallway sensor.")
    time.sleep(0.5)
    assert len(firings(triggers, channel_name, "noisy", 23)) == 22


def test_bad_trigger_feedback_is_refused(
    grpc_channel: grpc.Channel, memories: MemoryServiceStub, channel_name: str
) -> None:
    triggers = TriggerServiceStub(grpc_channel)
    rule = tpb.Trigger(
        id="quiet",
        channel=channel_name,
        event=tpb.EVENT_KIND_ON_STORE,
        action=tpb.ACTION_KIND_NOTIFY,
        config={"message": "x"},
    )
    triggers.CreateTrigger(tpb.CreateTriggerRequest(trigger=rule))
    store(memories, channel_name, "Something to fire on.")
    [fired] = firings(triggers, channel_name, "quiet", 1)
    cases = [
        (dict(trigger_id="quiet", cause_seq=fired.seq), grpc.StatusCode.INVALID_ARGUMENT, "rating"),
        (dict(trigger_id="quiet", rating=USEFUL), grpc.StatusCode.INVALID_ARGUMENT, "cause_seq"),
        (dict(cause_seq=fired.seq, rating=USEFUL), grpc.StatusCode.INVALID_ARGUMENT, "trigger_id"),
        (
            dict(trigger_id="nope", cause_seq=fired.seq, rating=USEFUL),
            grpc.StatusCode.NOT_FOUND,
            "nope",
        ),
        (
            dict(trigger_id="quiet", cause_seq=fired.seq + 10**6, rating=USEFUL),
            grpc.StatusCode.NOT_FOUND,
            "did not fire",
        ),
    ]
    for fields, code, says in cases:
        with pytest.raises(grpc.RpcError) as refused:
            triggers.TriggerFeedback(tpb.TriggerFeedbackRequest(channel=channel_name, **fields))  # type: ignore[arg-type]
        assert refused.value.code() == code and says in (refused.value.details() or ""), fields
    history = triggers.TriggerHistory(
        tpb.TriggerHistoryRequest(channel=channel_name, trigger_id="quiet")
    )
    assert history.rated == 0 and not history.HasField("precision"), "nothing was rated"

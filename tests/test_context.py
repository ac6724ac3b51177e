"""Context and EntityCard end to end: the block an agent prepends to its prompt, its reuse
window, and entity cards, through the generated stubs against a real server."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from google.protobuf.field_mask_pb2 import FieldMask

from calor.models.embedder import OnnxEmbedder
from calor.server.clock import ManualClock
from calor.v1 import memory_pb2
from calor.v1 import memory_service_pb2 as pb
from calor.v1 import settings_service_pb2 as spb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from calor.v1.settings_service_pb2_grpc import SettingsServiceStub
from tests.conftest import ServerThread
from tests.helpers import CORE, DAY, FACT, store, ts, utc

DINNER = "what should we cook for dinner tonight?"
ALLERGY = "The user is allergic to peanuts."
OTHERS = [
    "The quarterly report is due on the first Friday of the month.",
    "The team standup moved to 9:30 in the big meeting room.",
    "The staging server runs out of disk space every few weeks.",
    "The user's sister lives in Lisbon and visits in the summer.",
    "The user is learning to play the cello on weekends.",
    "The billing service retries failed card payments three times.",
    "The user drives a blue hatchback that needs new tyres.",
    "The garden hose leaks at the tap connector.",
    "The office wifi password changes every quarter.",
    "The user reads science fiction before bed.",
    "The deploy pipeline builds, tests, tags and then pushes the image.",
    "The user's favourite football club lost on Saturday.",
    "The printer on the third floor jams with thick paper.",
    "The user prefers aisle seats on long flights.",
    "The search index is rebuilt every night at two.",
    "The user's laptop battery lasts about four hours.",
    "Invoices from the cloud provider arrive on the third of each month.",
    "The user walks the dog along the river every morning.",
    "The conference talk slides are in the shared drive.",
    "The user keeps houseplants on the kitchen windowsill.",
]
ADA = [
    "Ada Lovelace wrote the first published computer program.",
    "Ada Lovelace worked with Charles Babbage on the Analytical Engine.",
    "Ada Lovelace was born in London in 1815.",
    "Ada Lovelace translated an article by Luigi Menabrea.",
    "Ada Lovelace imagined machines composing music.",
    "Ada Lovelace is remembered every October on Ada Lovelace Day.",
]
HOPPER = [
    "Grace Hopper built one of the first compilers.",
    "Grace Hopper popularised the word debugging.",
    "Grace Hopper served in the United States Navy.",
    "Grace Hopper helped design COBOL.",
]
RELATIVE = re.compile(r"\b(ago|yesterday|today|tomorrow|last week|this week|just now)\b", re.I)

Stubs = tuple[ManualClock, MemoryServiceStub, SettingsServiceStub]


@pytest.fixture(scope="module")
def clocked(start_server: Callable[..., ServerThread]) -> Iterator[Stubs]:
    """A server of this module's own whose clock only the tests move."""
    clock = ManualClock(1_780_000_000.0)  # 2026-05-28
    server = start_server(clock=clock)
    with grpc.insecure_channel(server.target) as channel:
        yield clock, MemoryServiceStub(channel), SettingsServiceStub(channel)


def fill(stub: MemoryServiceStub, channel: str, texts: list[str] = OTHERS) -> list[str]:
    """The allergy as a core memory, then ``texts``; the ids in that order."""
    allergy = store(stub, channel, ALLERGY, memory_type=CORE).id
    requests = [
        pb.StoreStreamRequest(store=pb.StoreRequest(channel=channel, text=t)) for t in texts
    ]
    return [allergy, *stub.StoreStream(iter(requests)).ids]


def context(
    stub: MemoryServiceStub, channel: str, message: str = DINNER, **fields: object
) -> pb.ContextResponse:
    return stub.Context(pb.ContextRequest(channel=channel, message=message, **fields))  # type: ignore[arg-type]


def shown(reply: pb.ContextResponse) -> list[str]:
    return [item.memory.id for item in reply.items]


def memory_lines(block: str) -> list[str]:
    return [line for line in block.splitlines() if line.startswith("- ")]


def states(stub: MemoryServiceStub, channel: str) -> dict[str, tuple[float, float, int, float]]:
    """Every memory's heat, heat0, recall count and stability."""
    page = stub.ListMemories(pb.ListMemoriesRequest(channel=channel, page_size=1000)).memories
    return {m.id: (m.heat, m.heat0, m.recall_count, m.stability) for m in page}


def refused(call: Callable[[], object], code: grpc.StatusCode, *words: str) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    details = caught.value.details() or ""
    assert caught.value.code() == code, (caught.value.code(), details)
    for word in words:
        assert word in details, details


def set_context_setting(settings: SettingsServiceStub, channel: str, **values: float) -> None:
    settings.UpdateSettings(
        spb.UpdateSettingsRequest(
            channel=channel,
            settings=memory_pb2.ChannelSettings(**values),
            update_mask=FieldMask(paths=list(values)),
        )
    )


# --- the block ---------------------------------------------------------------------------


def test_the_allergy_is_in_the_block_for_an_unrelated_dinner_question(
    clocked: Stubs, channel_name: str
) -> None:
    _, stub, _ = clocked
    [allergy, *_] = fill(stub, channel_name)

    reply = context(stub, channel_name, token_budget=150)

    assert ALLERGY in reply.block
    assert reply.block.startswith("## Profile\n")
    [item] = [i for i in reply.items if i.memory.id == allergy]
    assert item.signal == "profile"
    assert item.band in ("high", "mid", "low")
    assert len(reply.items) < len(OTHERS) + 1, "the budget holds only part of the channel"


def test_the_block_never_exceeds_its_budget_by_the_models_tokenizer(
    clocked: Stubs, channel_name: str, embedder: OnnxEmbedder
) -> None:
    _, stub, _ = clocked
    fill(stub, channel_name)
    for budget in (1, 8, 20, 24, 40, 75, 150, 400, 1000, 4000):
        reply = context(stub, channel_name, token_budget=budget)
        counted = embedder.count_tokens(reply.block)
        assert counted <= budget, (budget, reply.block)
        assert reply.tokens_used == counted
        assert len(memory_lines(reply.block)) == len(reply.items)
    assert context(stub, channel_name, token_budget=1).block == ""
    everything = context(stub, channel_name, token_budget=4000)
    assert len(everything.items) == len(OTHERS) + 1, "a large budget shows the whole channel"
    assert context(stub, channel_name).tokens_used <= 1000, "0 means 1000 tokens"


def test_max_nodes_and_max_chars_bound_the_block(clocked: Stubs, channel_name: str) -> None:
    _, stub, _ = clocked
    fill(stub, channel_name)

    few = context(stub, channel_name, max_nodes=3)
    short = context(stub, channel_name, max_chars=150)

    assert len(few.items) == 3 == len(memory_lines(few.block))
    assert 0 < len(short.block) <= 150
    assert len(short.items) == len(memory_lines(short.block))
    assert ALLERGY in few.block and ALLERGY in short.block, "core memories go in first"


def test_each_line_has_a_band_and_an_absolute_date_and_nothing_relative(
    clocked: Stubs, channel_name: str
) -> None:
    clock, stub, _ = clocked
    store(stub, channel_name, ALLERGY, memory_type=CORE, created_at=ts(utc("2026-03-01T09:00")))
    store(
        stub, channel_name, "The user cooked a mushroom risotto.", created_at=ts(clock.now() - DAY)
    )
    store(stub, channel_name, "The user bakes sourdough bread.", memory_type=FACT)

    reply = context(stub, channel_name)

    assert "- [" in reply.block and "] 2026-03-01 core: " + ALLERGY in reply.block
    assert "2026-05-27 episodic: The user cooked a mushroom risotto." in reply.block
    assert "2026-05-28 fact: The user bakes sourdough bread." in reply.block
    for line in memory_lines(reply.block):
        assert re.match(r"- \[(high|mid|low)\] \d{4}-\d{2}-\d{2} [a-z]+: ", line), line
    assert not RELATIVE.search(reply.block)
    assert not re.search(r"\d\.\d", reply.block), "no heat or score is shown"


def test_near_identical_texts_are_shown_once(clocked: Stubs, channel_name: str) -> None:
    _, stub, _ = clocked
    core = store(stub, channel_name, ALLERGY, memory_type=CORE).id
    store(stub, channel_name, "the user is allergic to peanuts", memory_type=FACT)
    store(stub, channel_name, "The user likes spicy food.", memory_type=FACT)

    reply = context(stub, channel_name)

    assert reply.block.lower().count("allergic to peanuts") == 1
    assert core in shown(reply), "the stronger one (core) is kept"


def test_a_message_naming_an_entity_brings_its_memories(clocked: Stubs, channel_name: str) -> None:
    _, stub, _ = clocked
    fill(stub, channel_name, OTHERS + ADA)

    reply = context(stub, channel_name, "Who was Ada Lovelace?")

    ada = {i.memory.text: i for i in reply.items if "Ada Lovelace" in i.memory.text}
    assert set(ada) == set(ADA)
    assert {i.signal for i in ada.values()} <= {"semantic", "entity", "profile"}


# --- reuse -------------------------------------------------------------------------------


def test_the_same_request_on_an_unchanged_channel_reuses_the_byte_identical_block(
    clocked: Stubs, channel_name: str
) -> None:
    _, stub, _ = clocked
    fill(stub, channel_name)

    first = context(stub, channel_name)
    second = context(stub, channel_name)
    other_budget = context(stub, channel_name, token_budget=500)

    assert first.block and second.block == first.block
    assert (first.reused, second.reused) == (False, True)
    assert second.tokens_used == first.tokens_used and shown(second) == shown(first)
    assert not other_budget.reused, "other limits make another block"
    assert first.recall_id and second.recall_id == first.recall_id, "one block, one log entry"
    assert other_budget.recall_id not in ("", first.recall_id)


def test_the_same_memories_render_the_same_text_without_the_window(
    clocked: Stubs, channel_name: str
) -> None:
    _, stub, settings = clocked
    fill(stub, channel_name)
    set_context_setting(settings, channel_name, context_reuse_seconds=0.0)

    first = context(stub, channel_name)
    second = context(stub, channel_name)

    assert (first.reused, second.reused) == (False, False)
    assert second.block == first.block


def test_a_store_a_change_a_forget_or_new_settings_end_the_reuse(
    clocked: Stubs, channel_name: str
) -> None:
    _, stub, settings = clocked
    fill(stub, channel_name)
    assert not context(stub, channel_name).reused

    store(stub, channel_name, "The user wants to try Thai cooking.")
    after_store = context(stub, channel_name)
    assert not after_store.reused
    assert context(stub, channel_name).reused

    [first, *_] = shown(after_store)
    stub.Update(pb.UpdateRequest(channel=channel_name, id=first, text=f"{ALLERGY} Severe."))
    after_update = context(stub, channel_name)
    assert not after_update.reused and f"{ALLERGY} Severe." in after_update.block

    gone = shown(after_update)[-1]
    stub.Forget(pb.ForgetRequest(channel=channel_name, ids=[gone]))
    after_forget = context(stub, channel_name)
    assert not after_forget.reused and gone not in shown(after_forget)

    set_context_setting(settings, channel_name, context_weight_recency=0.1)
    assert not context(stub, channel_name).reused
    assert context(stub, channel_name).reused


def test_heat_and_time_alone_keep_the_block_until_the_window_closes(
    clocked: Stubs, channel_name: str
) -> None:
    clock, stub, _ = clocked
    fill(stub, channel_name)
    first = context(stub, channel_name)

    stub.Recall(pb.RecallRequest(channel=channel_name, query="the staging server disk"))
    clock.advance(200)
    within = context(stub, channel_name)
    clock.advance(200)  # 400 s after the block was made: past the 300 s window
    past = context(stub, channel_name)

    assert within.reused and within.block == first.block
    assert not past.reused


def test_blocks_built_while_others_store_are_never_reused_stale(
    clocked: Stubs, channel_name: str
) -> None:
    _, stub, settings = clocked
    fill(stub, channel_name, OTHERS[:3])

    def storing() -> None:
        for n in range(12):
            store(stub, channel_name, f"Parcel number {n} arrived at the front desk.")

    def reading() -> None:
        for _ in range(12):
            context(stub, channel_name, token_budget=4000)

    with ThreadPoolExecutor(max_workers=4) as pool:
        running = [pool.submit(storing), *(pool.submit(reading) for _ in range(3))]
        for future in running:
            future.result(timeout=120)

    last = context(stub, channel_name, token_budget=4000)
    set_context_setting(settings, channel_name, context_reuse_seconds=299.0)
    fresh = context(stub, channel_name, token_budget=4000)

    assert not fresh.reused
    assert last.block == fresh.block, "a block reused after a store would lack the new memory"
    assert len(fresh.items) == 4 + 12


# --- heat --------------------------------------------------------------------------------


def test_context_reads_without_heating_and_heats_what_it_shows_when_asked(
    clocked: Stubs, channel_name: str
) -> None:
    clock, stub, _ = clocked
    fill(stub, channel_name)
    clock.advance(6 * 3600)
    identity = pb.IdentityRequest(channel=channel_name)
    before, heat_before = states(stub, channel_name), stub.Identity(identity).channel_heat

    read = context(stub, channel_name, "Is the user allergic to peanuts?")
    assert states(stub, channel_name) == before
    assert stub.Identity(identity).channel_heat == heat_before

    heating = context(stub, channel_name, "Is the user allergic to peanuts?", heat=True)
    after = states(stub, channel_name)

    assert heating.block == read.block and heating.reused
    relevant = [i.memory.id for i in heating.items if i.band in ("mid", "high")]
    assert relevant, "the allergy answers the question"
    for memory_id in relevant:
        assert after[memory_id][2] == before[memory_id][2] + 1
        assert after[memory_id][0] > before[memory_id][0]
    for item in heating.items:
        if item.band == "low":
            assert after[item.memory.id][2] == before[item.memory.id][2]
    assert {i.memory.id: i.memory.recall_count for i in heating.items} == {
        i: after[i][2] for i in shown(heating)
    }, "each item is its memory as it stands after the call"
    assert read.recall_id and heating.recall_id and read.recall_id != heating.recall_id
    rated = stub.Feedback(
        pb.FeedbackRequest(
            channel=channel_name, recall_id=read.recall_id, rating=pb.FEEDBACK_RATING_HELPFUL
        )
    )
    assert sum(rated.helpful_by_type.values()) >= 1, "a read's recall id takes feedback"


# --- entity cards -------------------------------------------------------------------------


def test_an_entity_named_in_six_memories_has_a_card_that_includes_them(
    clocked: Stubs, channel_name: str
) -> None:
    _, stub, _ = clocked
    ids = fill(stub, channel_name, OTHERS + ADA)
    ada = ids[-len(ADA) :]

    card = stub.EntityCard(pb.EntityCardRequest(channel=channel_name, entity="ada  LOVELACE"))
    again = stub.EntityCard(pb.EntityCardRequest(channel=channel_name, entity="Ada Lovelace"))

    assert card.entity == "Ada Lovelace"
    assert {m.id for m in card.memories} == set(ada)
    assert card.card.startswith("## Ada Lovelace\n")
    for text in ADA:
        assert text in card.card
    assert again.card == card.card
    assert len(memory_lines(card.card)) == len(card.memories)


def test_a_card_follows_its_memories_and_needs_five(clocked: Stubs, channel_name: str) -> None:
    _, stub, _ = clocked
    ids = fill(stub, channel_name, ADA)
    request = pb.EntityCardRequest(channel=channel_name, entity="Ada Lovelace")
    assert len(stub.EntityCard(request).memories) == 6

    stub.Forget(pb.ForgetRequest(channel=channel_name, ids=[ids[1]]))
    five = stub.EntityCard(request)
    assert ids[1] not in {m.id for m in five.memories} and len(five.memories) == 5

    added = store(stub, channel_name, "Ada Lovelace corresponded with Mary Somerville.").id
    assert added in {m.id for m in stub.EntityCard(request).memories}

    stub.Dream(pb.DreamRequest(channel=channel_name))
    assert len(stub.EntityCard(request).memories) == 6, "a dream rebuilds the card"

    stub.Forget(pb.ForgetRequest(channel=channel_name, ids=[ids[2], ids[3]]))
    refused(lambda: stub.EntityCard(request), grpc.StatusCode.NOT_FOUND, "named in 4", "at least 5")


def test_an_entity_in_four_memories_or_an_unknown_channel_has_no_card(
    clocked: Stubs, channel_name: str
) -> None:
    _, stub, _ = clocked
    fill(stub, channel_name, HOPPER)
    refused(
        lambda: stub.EntityCard(pb.EntityCardRequest(channel=channel_name, entity="Grace Hopper")),
        grpc.StatusCode.NOT_FOUND,
        "Grace Hopper",
        "at least 5",
    )
    refused(
        lambda: stub.EntityCard(pb.EntityCardRequest(channel=f"{channel_name}-x", entity="Ada")),
        grpc.StatusCode.NOT_FOUND,
    )
    for bad in ("", "   ", "...", "x" * 201):
        request = pb.EntityCardRequest(channel=channel_name, entity=bad)
        refused(lambda r=request: stub.EntityCard(r), grpc.StatusCode.INVALID_ARGUMENT, "entity")


# --- bad input ----------------------------------------------------------------------------


def test_bad_context_requests_are_refused(clocked: Stubs, channel_name: str) -> None:
    _, stub, _ = clocked
    fill(stub, channel_name, OTHERS[:2])
    bad = {
        "message": {"message": ""},
        "token_budget": {"token_budget": -1},
        "max_nodes": {"max_nodes": 5000},
        "max_chars": {"max_chars": -5},
    }
    for word, fields in bad.items():
        request = pb.ContextRequest(channel=channel_name, **{"message": DINNER, **fields})  # type: ignore[arg-type]
        refused(lambda r=request: stub.Context(r), grpc.StatusCode.INVALID_ARGUMENT, word)
    refused(
        lambda: stub.Context(pb.ContextRequest(channel="", message=DINNER)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "channel",
    )


def test_an_unknown_channel_has_an_empty_block(clocked: Stubs, channel_name: str) -> None:
    _, stub, _ = clocked
    reply = context(stub, channel_name, heat=True)
    assert (reply.block, reply.tokens_used, list(reply.items), reply.reused) == ("", 0, [], False)
    assert stub.Identity(pb.IdentityRequest(channel=channel_name)).total == 0


def test_tokens_are_counted_whole_without_special_tokens(embedder: OnnxEmbedder) -> None:
    assert embedder.count_tokens("") == 0
    assert embedder.count_tokens("word " * 1000) == 1000, "no truncation at 512"
    assert embedder.count_tokens("## Profile") == 3

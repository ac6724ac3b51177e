"""The LangGraph store (``calor.client.langgraph``) against the real ``langgraph`` package
and a real server: namespaces as channels, put/get/search/delete, sync and async, and a
compiled graph whose node reads and writes through it."""

from __future__ import annotations

import asyncio
import operator
from collections.abc import Iterator
from typing import Annotated, TypedDict

import pytest
from langgraph.config import get_store
from langgraph.graph import END, START, StateGraph
from langgraph.store.base import InvalidNamespaceError, Item

from calor.client import CalorClient
from calor.client.langgraph import KEY_TAG, CalorStore, channel_of, namespace_of


@pytest.fixture
def store(calor_target: str) -> Iterator[CalorStore]:
    with CalorStore(calor_target) as calor:
        yield calor


@pytest.fixture
def user(channel_name: str) -> str:
    """A namespace root label no other test uses."""
    return channel_name.replace(".", "-")


def test_an_item_is_put_read_back_replaced_and_deleted(
    store: CalorStore, user: str, calor_target: str
) -> None:
    namespace = (user, "preferences")
    value = {"food": "pizza", "spice": {"level": 3, "kinds": ["chili", "pepper"]}}
    store.put(namespace, "food", value)
    item = store.get(namespace, "food")
    assert isinstance(item, Item)
    assert (item.namespace, item.key, item.value) == (namespace, "food", value)
    assert item.created_at.tzinfo is not None and item.updated_at >= item.created_at

    store.put(namespace, "food", {"food": "ramen"})
    replaced = store.get(namespace, "food")
    assert replaced is not None and replaced.value == {"food": "ramen"}
    assert replaced.created_at == item.created_at and replaced.updated_at > item.updated_at
    with CalorClient(calor_target, channel=channel_of(namespace)) as client:
        held = list(client.iter_memories(tags={KEY_TAG: "food"}))
    assert len(held) == 1  # one memory per key: a put again updates it

    store.delete(namespace, "food")
    assert store.get(namespace, "food") is None
    assert store.get(namespace, "never-put") is None
    assert store.get((user, "no-such-namespace"), "food") is None


def test_search_ranks_by_meaning_under_a_prefix_and_filters_and_pages(
    store: CalorStore, user: str
) -> None:
    notes = {
        ("work",): {
            "deploy": {"text": "Deploys go out on Tuesdays after the tests pass.", "stars": 2},
            "standup": {"text": "The team standup is at ten every morning.", "stars": 5},
        },
        ("home",): {
            "cat": {"text": "The cat is called Miso and eats twice a day.", "stars": 4},
            "plants": {"text": "Water the fern on Sundays.", "stars": 1},
        },
    }
    for sub, items in notes.items():
        for key, value in items.items():
            store.put((user, *sub), key, value)

    hits = store.search((user,), query="what is my pet's name?", limit=2)
    assert [(hit.namespace, hit.key) for hit in hits][0] == ((user, "home"), "cat")
    assert all(hit.score is not None for hit in hits) and hits[0].score >= hits[-1].score
    assert len(hits) == 2

    work = store.search((user, "work"), query="when do we ship releases?")
    assert {hit.key for hit in work} == {"deploy", "standup"} and work[0].key == "deploy"

    starred = store.search((user,), filter={"stars": {"$gte": 4}})
    assert {hit.key for hit in starred} == {"standup", "cat"}
    assert all(hit.score is None for hit in starred)
    newest_first = store.search((user,), limit=10)
    assert [hit.key for hit in newest_first] == ["plants", "cat", "standup", "deploy"]
    assert [hit.key for hit in store.search((user,), limit=2, offset=1)] == ["cat", "standup"]
    exact = store.search((user,), query="fern", filter={"text": "Water the fern on Sundays."})
    assert [hit.key for hit in exact] == ["plants"]


def test_a_search_is_a_recall_that_warms_what_it_finds_unless_peeking(
    calor_target: str, user: str
) -> None:
    namespace = (user, "facts")
    with CalorStore(calor_target, peek=True) as peeking, CalorStore(calor_target) as store:
        store.put(namespace, "allergy", {"text": "The user is allergic to peanuts."})
        channel = channel_of(namespace)
        with CalorClient(calor_target, channel=channel) as client:

            def recalls() -> int:
                (memory,) = client.iter_memories(tags={KEY_TAG: "allergy"})
                return memory.recall_count

            peeking.search(namespace, query="what is the user allergic to?")
            assert recalls() == 0
            store.search(namespace, query="what is the user allergic to?")
            assert recalls() == 1


def test_memories_stored_without_the_store_are_items_keyed_by_their_id(
    store: CalorStore, user: str, calor_target: str
) -> None:
    namespace = (user, "notes")
    with CalorClient(calor_target, channel=channel_of(namespace)) as client:
        memory = client.store("Ana moved to Porto in May.")
    item = store.get(namespace, memory.id)
    assert item is not None and item.value == {"text": "Ana moved to Porto in May."}
    (hit,) = store.search(namespace, query="where does Ana live?")
    assert (hit.key, hit.value) == (memory.id, {"text": "Ana moved to Porto in May."})
    store.delete(namespace, memory.id)
    assert store.get(namespace, memory.id) is None


def test_namespaces_are_listed_by_prefix_suffix_and_depth(store: CalorStore, user: str) -> None:
    for namespace in [(user, "a", "x"), (user, "a", "y"), (user, "b", "x"), (user, "café au lait")]:
        store.put(namespace, "k", {"text": f"An item of {'/'.join(namespace)}."})
    mine = store.list_namespaces(prefix=(user,))
    assert mine == sorted(mine) and set(mine) == {
        (user, "a", "x"),
        (user, "a", "y"),
        (user, "b", "x"),
        (user, "café au lait"),
    }
    assert store.list_namespaces(prefix=(user, "*", "x")) == [(user, "a", "x"), (user, "b", "x")]
    assert store.list_namespaces(prefix=(user,), suffix=("y",)) == [(user, "a", "y")]
    assert store.list_namespaces(prefix=(user,), max_depth=2) == [
        (user, "a"),
        (user, "b"),
        (user, "café au lait"),
    ]
    assert store.list_namespaces(prefix=(user,), limit=1, offset=1) == [(user, "a", "y")]


def test_a_namespace_maps_to_a_channel_and_back() -> None:
    for namespace in [("users", "alice"), ("café au lait", "x+y", "a/b:c@d"), ("7",)]:
        assert namespace_of(channel_of(namespace)) == namespace
    assert channel_of(("users", "alice", "memories")) == "users.alice.memories"
    with pytest.raises(InvalidNamespaceError, match="start with a letter or digit"):
        channel_of(("_private",))
    with pytest.raises(InvalidNamespaceError, match="128"):
        channel_of(("x" * 100, "y" * 100))


def test_the_async_methods_do_what_the_sync_ones_do(calor_target: str, user: str) -> None:
    namespace = (user, "async")

    async def session() -> None:
        store = CalorStore(calor_target)
        await store.aput(namespace, "theme", {"text": "The user prefers dark mode."})
        await store.aput(namespace, "units", {"text": "The user measures in metric units."})
        item = await store.aget(namespace, "theme")
        assert item is not None and item.value == {"text": "The user prefers dark mode."}
        hits = await store.asearch(namespace, query="light or dark screen?")
        assert hits[0].key == "theme"
        assert (user, "async") in await store.alist_namespaces(prefix=(user,))
        await store.adelete(namespace, "theme")
        assert await store.aget(namespace, "theme") is None
        store.close()

    asyncio.run(session())


class _Turn(TypedDict):
    question: str
    answers: Annotated[list[str], operator.add]


def test_a_compiled_graph_remembers_through_the_store(store: CalorStore, user: str) -> None:
    namespace = (user, "graph")

    def remember(state: _Turn) -> dict[str, list[str]]:
        get_store().put(namespace, "said", {"text": state["question"]})
        return {"answers": []}

    def recall(state: _Turn) -> dict[str, list[str]]:
        hits = get_store().search(namespace, query="what did the user say about the trip?")
        return {"answers": [hit.value["text"] for hit in hits]}

    builder = StateGraph(_Turn)
    builder.add_node("remember", remember)
    builder.add_node("recall", recall)
    builder.add_edge(START, "remember")
    builder.add_edge("remember", "recall")
    builder.add_edge("recall", END)
    graph = builder.compile(store=store)
    said = "We leave for the Lisbon trip on Friday."
    result = graph.invoke({"question": said, "answers": []})
    assert result["answers"] == [said]

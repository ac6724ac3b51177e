"""The LangChain retriever (``calor.client.langchain``) against the real ``langchain-core``
and a real server: a query's documents, best first, with the memory's metadata, sync and
async, and the retriever in a runnable chain."""

from __future__ import annotations

import asyncio

import pytest
from langchain_core.documents import Document
from langchain_core.runnables import RunnableLambda

from calor.client import CalorClient
from calor.client.langchain import CalorRetriever

NOTES = [
    "The user is allergic to peanuts.",
    "Deploys go out on Tuesdays after the tests pass.",
    "The cat is called Miso and eats twice a day.",
]


@pytest.fixture
def stored(client: CalorClient) -> dict[str, str]:
    """The notes, stored in the test's channel: text to id."""
    return {text: client.store(text).id for text in NOTES}


def test_a_query_gives_the_memories_as_documents_best_first(
    calor_target: str, channel_name: str, stored: dict[str, str]
) -> None:
    retriever = CalorRetriever(target=calor_target, channel=channel_name, k=2)
    documents = retriever.invoke("what can't the user eat?")
    assert 1 <= len(documents) <= 2
    first = documents[0]
    assert isinstance(first, Document) and first.page_content == NOTES[0]
    assert first.id == stored[NOTES[0]] and first.metadata["id"] == stored[NOTES[0]]
    assert first.metadata["channel"] == channel_name
    assert first.metadata["band"] in ("high", "mid", "low") and first.metadata["score"] > 0
    assert first.metadata["memory_type"] in ("fact", "preference", "episodic", "semantic")
    assert first.metadata["created_at"].endswith("+00:00")


def test_min_band_and_types_narrow_what_comes_back(
    calor_target: str, channel_name: str, stored: dict[str, str]
) -> None:
    everything = CalorRetriever(target=calor_target, channel=channel_name, k=10, peek=True)
    high = CalorRetriever(
        target=calor_target, channel=channel_name, k=10, peek=True, min_band="high"
    )
    query = "what is the cat's name?"
    assert len(high.invoke(query)) < len(everything.invoke(query))
    assert all(doc.metadata["band"] == "high" for doc in high.invoke(query))


def test_a_retrieval_warms_what_it_finds_unless_peeking(
    calor_target: str, channel_name: str, client: CalorClient, stored: dict[str, str]
) -> None:
    cat = stored[NOTES[2]]
    CalorRetriever(target=calor_target, channel=channel_name, peek=True).invoke("the cat")
    assert client.inspect(cat).memory.recall_count == 0
    CalorRetriever(target=calor_target, channel=channel_name).invoke("the cat")
    assert client.inspect(cat).memory.recall_count == 1


def test_the_async_retrieval_and_a_chain_give_the_same_documents(
    calor_target: str, channel_name: str, stored: dict[str, str]
) -> None:
    retriever = CalorRetriever(target=calor_target, channel=channel_name, k=1, peek=True)
    found = asyncio.run(retriever.ainvoke("when do we ship?"))
    assert [doc.page_content for doc in found] == [NOTES[1]]
    chain = retriever | RunnableLambda(lambda docs: "\n".join(d.page_content for d in docs))
    assert chain.invoke("when do we ship?") == NOTES[1]


def test_the_connection_defaults_come_from_the_environment(
    calor_target: str, channel_name: str, stored: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CALOR_TARGET", calor_target)
    monkeypatch.setenv("CALOR_CHANNEL", channel_name)
    (document,) = CalorRetriever(k=1, peek=True).invoke("peanut allergy")
    assert document.page_content == NOTES[0]

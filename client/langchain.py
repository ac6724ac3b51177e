"""A LangChain retriever over Calor recall (the ``calor[langchain]`` extra)."""

from __future__ import annotations

import asyncio
from datetime import UTC
from typing import Any

from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from pydantic import PrivateAttr

from calor.client._enums import short_name
from calor.client.aio import AsyncCalorClient
from calor.client.client import CalorClient
from calor.v1 import memory_pb2, memory_service_pb2

__all__ = ["CalorRetriever"]


class CalorRetriever(BaseRetriever):
    """Documents for a query from a Calor channel, ranked by meaning and heat: each hit's
    text, with the memory's id, channel, type, heat, score, band, tags and creation time
    as metadata. A retrieval is a recall: what it returns warms, unless ``peek``.

    The connection (``target``, ``channel``, ``api_key``, ``tls_ca``) defaults as
    :class:`~calor.client.CalorClient`'s does, from ``CALOR_TARGET`` and the rest.
    """

    target: str | None = None
    """The server; None reads ``CALOR_TARGET`` (else ``localhost:50051``)."""
    channel: str | None = None
    """The channel to recall from; None reads ``CALOR_CHANNEL`` (else ``default``)."""
    channels: list[str] = []
    """Further channels to search."""
    k: int = 4
    """At most this many documents."""
    min_band: str = ""
    """Leave out hits whose band is below this: ``"low"``, ``"mid"`` or ``"high"``."""
    memory_types: list[str] = []
    """Only these memory types (``"fact"``, ``"preference"``, …); empty means all."""
    peek: bool = False
    """Retrieve without warming what is found."""
    api_key: str | None = None
    """The key to call with; None reads ``CALOR_API_KEY``."""
    tls_ca: str | None = None
    """A CA certificate (PEM file) to speak TLS with; None reads ``CALOR_TLS_CA``."""
    timeout: float | None = 30.0
    """Seconds per call."""

    _client: CalorClient | None = PrivateAttr(default=None)
    _async: tuple[asyncio.AbstractEventLoop, AsyncCalorClient] | None = PrivateAttr(default=None)

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        if self._client is None:
            self._client = CalorClient(self.target, channel=self.channel, **self._connection())
        return _documents(self._client.recall(query, **self._options()))

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun
    ) -> list[Document]:
        loop = asyncio.get_running_loop()
        if self._async is None or self._async[0] is not loop:
            client = AsyncCalorClient(self.target, channel=self.channel, **self._connection())
            self._async = (loop, client)
        return _documents(await self._async[1].recall(query, **self._options()))

    def _connection(self) -> dict[str, Any]:
        return {"api_key": self.api_key, "tls_ca": self.tls_ca, "timeout": self.timeout}

    def _options(self) -> dict[str, Any]:
        return {
            "limit": self.k,
            "channels": self.channels,
            "memory_types": self.memory_types,
            "min_band": self.min_band,
            "peek": self.peek,
        }


def _documents(response: memory_service_pb2.RecallResponse) -> list[Document]:
    """The hits of a recall as documents, best first."""
    documents = []
    for hit in response.hits:
        memory = hit.memory
        metadata = {
            "id": memory.id,
            "channel": memory.channel,
            "memory_type": short_name(memory_pb2.MemoryType, "MEMORY_TYPE_", memory.memory_type),
            "heat": memory.heat,
            "score": hit.score,
            "band": hit.band,
            "tags": dict(memory.tags),
            "created_at": memory.created_at.ToDatetime(tzinfo=UTC).isoformat(),
        }
        documents.append(Document(page_content=memory.text, id=memory.id, metadata=metadata))
    return documents

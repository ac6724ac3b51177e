"""The synchronous Calor client: typed methods over the Memory and Trigger services."""

from __future__ import annotations

from collections.abc import Generator, Iterable, Iterator
from typing import Self, Unpack

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from calor.client import _convert, _convert_triggers, _enums, _transfer
from calor.client._convert import (
    ContextOptions,
    ListOptions,
    RecallOptions,
    StoreOptions,
    UpdateOptions,
)
from calor.client._convert_triggers import TriggerOptions
from calor.client._enums import EnumArg
from calor.client._subscription import Backoff, EventStream, Resumer
from calor.client._transfer import DEFAULT_CHUNK_CHARS, MarkdownSource
from calor.client.errors import ServerError, translate_rpc_errors
from calor.v1 import (
    memory_pb2,
    memory_service_pb2,
    memory_service_pb2_grpc,
    trigger_service_pb2,
    trigger_service_pb2_grpc,
)

__all__ = ["CalorClient", "EventStream"]


class CalorClient(_convert.ClientBase):
    """A blocking client of one Calor server, working in one default channel.

    Making one does no I/O: the gRPC channel connects on the first call. Every
    failed call raises a :class:`~calor.client.errors.CalorClientError`.

    Example::

        with CalorClient("localhost:50051", channel="agent-7") as calor:
            memory = calor.store("The user is allergic to peanuts.", memory_type="core")
            hits = calor.recall("what is the user allergic to?").hits

    Args:
        target: The server's ``host:port``.
        channel: The memory channel calls use unless they pass ``channel=``.
        timeout: Seconds each call may take; None waits for ever.
        grpc_channel: A ready ``grpc.Channel`` to use instead of an insecure
            channel to ``target`` (for TLS or interceptors). The caller keeps it:
            :meth:`close` leaves it open.
    """

    def __init__(
        self,
        target: str = "localhost:50051",
        *,
        channel: str = "default",
        timeout: float | None = 30.0,
        grpc_channel: grpc.Channel | None = None,
    ) -> None:
        super().__init__(target, channel, timeout)
        self._owns_channel = grpc_channel is None
        self._grpc_channel = grpc.insecure_channel(target) if grpc_channel is None else grpc_channel
        self._stub = memory_service_pb2_grpc.MemoryServiceStub(self._grpc_channel)
        self._triggers = trigger_service_pb2_grpc.TriggerServiceStub(self._grpc_channel)
        self._health = health_pb2_grpc.HealthStub(self._grpc_channel)

    def close(self) -> None:
        """Close the gRPC channel the client made (not one it was given)."""
        if self._owns_channel:
            self._grpc_channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def store(
        self,
        text: str,
        *,
        channel: str | None = None,
        idempotency_key: str | None = None,
        **options: Unpack[StoreOptions],
    ) -> memory_pb2.Memory:
        """Store one memory; it is durable once this returns.

        Args:
            text: What to remember.
            channel: The channel to store in, instead of the client's.
            idempotency_key: A retry with the same key returns the first memory and
                stores nothing; use one when retrying after a deadline.
            **options: Its type, importance, tags, …: see
                :class:`~calor.client._convert.StoreOptions`.

        Returns:
            The stored memory, with its id, type and current heat.
        """
        request = _convert.store_request(self._in(channel), text, idempotency_key, **options)
        with translate_rpc_errors():
            return self._stub.Store(request, timeout=self.timeout).memory

    def store_many(
        self,
        items: Iterable[str | memory_service_pb2.StoreRequest],
        *,
        channel: str | None = None,
        **options: Unpack[StoreOptions],
    ) -> list[str]:
        """Store many memories in one stream, embedded in batches on the server.

        Args:
            items: Texts, which take the options below, or whole ``StoreRequest``
                messages, sent as they are (in ``channel`` if they name none).
            channel: The channel to store in, instead of the client's.
            **options: As for :meth:`store`, for the text items: see
                :class:`~calor.client._convert.StoreOptions`.

        Returns:
            The new ids, in the order of ``items``.
        """
        messages = _convert.stream_requests(self._in(channel), items, **options)
        if not messages:
            return []
        with translate_rpc_errors():
            return list(self._stub.StoreStream(iter(messages), timeout=self.timeout).ids)

    def recall(
        self, query: str, *, channel: str | None = None, **options: Unpack[RecallOptions]
    ) -> memory_service_pb2.RecallResponse:
        """Find the memories that answer a query, ranked by meaning and heat.

        Recalling warms what it returns (unless ``peek``), so what an agent keeps
        using stays at hand.

        Args:
            query: What to look for, in plain words ("what did we decide yesterday?").
            channel: The channel to search, instead of the client's.
            **options: The limit, further channels, filters by type, state, tags,
                time and heat, ``peek``, …: see :class:`~calor.client._convert.RecallOptions`.

        Returns:
            The hits, best first, each with its score parts and band, and the time
            window the query named, if any.
        """
        request = _convert.recall_request(self._in(channel), query, **options)
        with translate_rpc_errors():
            return self._stub.Recall(request, timeout=self.timeout)

    def inspect(
        self, memory_id: str, *, channel: str | None = None
    ) -> memory_service_pb2.InspectResponse:
        """One memory, in any state, and its graph edges.

        Raises:
            NotFoundError: No memory has that id in the channel.
        """
        request = memory_service_pb2.InspectRequest(channel=self._in(channel), id=memory_id)
        with translate_rpc_errors():
            return self._stub.Inspect(request, timeout=self.timeout)

    def list_memories(
        self,
        *,
        channel: str | None = None,
        page_token: str = "",
        **options: Unpack[ListOptions],
    ) -> memory_service_pb2.ListMemoriesResponse:
        """One page of a channel's memories; pass ``next_page_token`` back for the next.

        The ``options`` are the page size and the filters of :meth:`recall`: see
        :class:`~calor.client._convert.ListOptions`. :meth:`iter_memories` walks
        every page.
        """
        request = _convert.list_request(self._in(channel), page_token, **options)
        with translate_rpc_errors():
            return self._stub.ListMemories(request, timeout=self.timeout)

    def iter_memories(
        self, *, channel: str | None = None, **options: Unpack[ListOptions]
    ) -> Iterator[memory_pb2.Memory]:
        """Every memory that :meth:`list_memories` would page through, fetched page by page."""
        request = _convert.list_request(self._in(channel), "", **options)
        while True:
            with translate_rpc_errors():
                page = self._stub.ListMemories(request, timeout=self.timeout)
            yield from page.memories
            if not page.next_page_token:
                return
            request.page_token = page.next_page_token

    def update(
        self, memory_id: str, *, channel: str | None = None, **options: Unpack[UpdateOptions]
    ) -> memory_pb2.Memory:
        """Correct a memory; only the fields given change (a new text is re-embedded).

        Args:
            memory_id: The memory to correct.
            channel: Its channel, instead of the client's.
            **options: The corrected ``text``, ``memory_type``, ``tags`` or
                ``importance``, and what it ``supersedes``: see
                :class:`~calor.client._convert.UpdateOptions`.

        Returns:
            The memory as corrected.
        """
        request = _convert.update_request(self._in(channel), memory_id, **options)
        with translate_rpc_errors():
            return self._stub.Update(request, timeout=self.timeout).memory

    def keystone(
        self, memory_id: str, on: bool = True, *, channel: str | None = None
    ) -> memory_pb2.Memory:
        """Pin a memory as a keystone (it stops decaying), or unpin it with ``on=False``."""
        request = memory_service_pb2.KeystoneRequest(
            channel=self._in(channel), id=memory_id, keystone=on
        )
        with translate_rpc_errors():
            return self._stub.Keystone(request, timeout=self.timeout).memory

    def boost(
        self, memory_id: str, delta: float = 0.0, *, channel: str | None = None
    ) -> memory_pb2.Memory:
        """Add heat to a memory: ``delta`` in [-1, 1]; 0 means the channel's boost_delta."""
        request = memory_service_pb2.BoostRequest(
            channel=self._in(channel), id=memory_id, delta=delta
        )
        with translate_rpc_errors():
            return self._stub.Boost(request, timeout=self.timeout).memory

    def forget(self, ids: str | Iterable[str], *, channel: str | None = None) -> int:
        """Forget one memory or many by id; returns how many were forgotten."""
        request = _convert.forget_request(self._in(channel), ids)
        with translate_rpc_errors():
            return int(self._stub.Forget(request, timeout=self.timeout).forgotten)

    def identity(self, *, channel: str | None = None) -> memory_service_pb2.IdentityResponse:
        """The channel's status: counts by state and type, heat, gates, conflicts, settings."""
        request = memory_service_pb2.IdentityRequest(channel=self._in(channel))
        with translate_rpc_errors():
            return self._stub.Identity(request, timeout=self.timeout)

    def feedback(
        self,
        recall_id: str,
        rating: EnumArg,
        memory_ids: str | Iterable[str] = (),
        *,
        channel: str | None = None,
    ) -> memory_service_pb2.FeedbackResponse:
        """Say whether a recall helped; the last feedback on a recall is the one that counts.

        Args:
            recall_id: The ``recall_id`` a recall (or a context block) returned.
            rating: ``"helpful"``, ``"unhelpful"`` or ``"partial"``.
            memory_ids: The hits the rating is about; none means the whole recall.
            channel: The channel that recalled, instead of the client's.

        Returns:
            The channel's rated recalls of the last 30 days per memory type, by rating.

        Raises:
            NotFoundError: The channel logged no recall with that id (or no longer keeps it).
            InvalidArgumentError: A named memory is not a hit of that recall.
        """
        request = _convert.feedback_request(self._in(channel), recall_id, rating, memory_ids)
        with translate_rpc_errors():
            return self._stub.Feedback(request, timeout=self.timeout)

    def tune(
        self, *, channel: str | None = None, dry_run: bool = False
    ) -> memory_service_pb2.TuneResponse:
        """Fit the channel's recall weights to its feedback, and apply them only if they
        rank the held-back feedback better (never with ``dry_run``).

        Returns:
            Recalls fitted and held back, agreement on those held back before and
            after, the weights before and after by settings name, whether they were
            applied, and an explanation.

        Raises:
            ServerError: FAILED_PRECONDITION while the channel has fewer than 20
                recalls with feedback.
        """
        request = _convert.tune_request(self._in(channel), dry_run)
        with translate_rpc_errors():
            return self._stub.Tune(request, timeout=self.timeout)

    def context(
        self, message: str, *, channel: str | None = None, **options: Unpack[ContextOptions]
    ) -> memory_service_pb2.ContextResponse:
        """The block of memories an agent prepends to its prompt for a message.

        The same memories give byte-identical text, so a prompt cache keeps working;
        unless ``heat=True`` the block changes nothing.

        Args:
            message: What the agent is about to answer.
            channel: The channel to draw on, instead of the client's.
            **options: The token budget, ``heat`` and the node and character caps:
                see :class:`~calor.client._convert.ContextOptions`.

        Returns:
            The rendered ``block``, ``tokens_used``, each memory chosen with the
            signal that found it, and the ``recall_id`` to give feedback on.
        """
        request = _convert.context_request(self._in(channel), message, **options)
        with translate_rpc_errors():
            return self._stub.Context(request, timeout=self.timeout)

    def evaluate(
        self, text: str, *, channel: str | None = None, store_findings: bool = False
    ) -> memory_service_pb2.EvaluateResponse:
        """Check a text an agent is about to say against the channel's memories.

        Args:
            text: The text to check.
            channel: The channel to check against, instead of the client's.
            store_findings: Store each misalignment found as an episodic memory.

        Returns:
            The ``alignment`` (0..1), each issue (contradiction, preference drift,
            stale reference) with the memory behind it, and the ids stored.
        """
        request = memory_service_pb2.EvaluateRequest(
            channel=self._in(channel), text=text, store_findings=store_findings
        )
        with translate_rpc_errors():
            return self._stub.Evaluate(request, timeout=self.timeout)

    def share(
        self, memory_id: str, target_channel: str, *, channel: str | None = None
    ) -> memory_pb2.Memory:
        """Copy a memory into another channel, prefixed ``[Shared by CHANNEL]``, with
        provenance; the copy is a new memory with its own heat.

        Returns:
            The copy, in ``target_channel``.
        """
        request = memory_service_pb2.ShareRequest(
            channel=self._in(channel), id=memory_id, target_channel=target_channel
        )
        with translate_rpc_errors():
            return self._stub.Share(request, timeout=self.timeout).memory

    def entity_card(
        self, entity: str, *, channel: str | None = None
    ) -> memory_service_pb2.EntityCardResponse:
        """What the channel knows about an entity its memories name at least five times.

        Returns:
            The card's ``memories`` (core, facts and preferences first) and its rendered
            ``card`` text.

        Raises:
            NotFoundError: Fewer than five memories name the entity.
        """
        request = memory_service_pb2.EntityCardRequest(channel=self._in(channel), entity=entity)
        with translate_rpc_errors():
            return self._stub.EntityCard(request, timeout=self.timeout)

    def dream(self, *, channel: str | None = None) -> memory_service_pb2.DreamResponse:
        """Consolidate a channel now: migrate, merge, promote, prune, archive.

        Returns:
            The dream report: how many memories each step changed, the channel's
            heat before and after, and how long it took.
        """
        request = memory_service_pb2.DreamRequest(channel=self._in(channel))
        with translate_rpc_errors():
            return self._stub.Dream(request, timeout=self.timeout)

    def export(
        self, *, channel: str | None = None, include_archived: bool = False
    ) -> Generator[memory_service_pb2.ExportResponse, None, None]:
        """Stream a channel out as Markdown, a chunk at a time.

        The first message is the header (``memories`` 0), whose text counts the
        memories (``· 3 memories``: :func:`~calor.client._transfer.export_total` reads
        it); each later one holds ``memories`` whole sections. Joined, the ``markdown``
        of every message is a document that :meth:`import_markdown` reads back.

        Nothing is sent until the first message is asked for, and the client's
        ``timeout`` bounds the whole stream: make the client with ``timeout=None`` to
        export a large channel. Closing the generator (or dropping it) before the end
        cancels the call.

        Example::

            with open("agent-7.md", "w", encoding="utf-8", newline="") as out:
                for chunk in calor.export():
                    out.write(chunk.markdown)

        Args:
            channel: The channel to export, instead of the client's.
            include_archived: Export archived memories too (cold and active ones always).

        Returns:
            A generator of ``ExportResponse`` messages, header first.
        """
        request = _transfer.export_request(self._in(channel), include_archived)
        call = self._stub.Export(request, timeout=self.timeout)
        try:
            with translate_rpc_errors():
                yield from call
        finally:
            call.cancel()  # when the caller stops early; a no-op once the stream has ended

    def import_markdown(
        self,
        source: MarkdownSource,
        *,
        channel: str | None = None,
        chunk_chars: int = DEFAULT_CHUNK_CHARS,
    ) -> list[str]:
        """Store the memories that Markdown holds: an export, or a plain list of notes.

        The text streams to the server in chunks of ``chunk_chars`` characters, read
        from ``source`` as they are sent. The import is all or nothing: on bad input
        nothing is stored. The client's ``timeout`` bounds the whole call.

        Example::

            with open("agent-7.md", encoding="utf-8", newline="") as notes:
                ids = calor.import_markdown(notes, channel="agent-7-copy")

        Args:
            source: The Markdown: the whole text, or its pieces in order (an open text
                file yields its lines; open it with ``newline=""`` so that a lone
                ``"\r"`` in a memory's text survives).
            channel: The channel to import into, instead of the client's.
            chunk_chars: Characters per message, at least 1.

        Returns:
            The new memories' ids, in document order.

        Raises:
            InvalidArgumentError: The Markdown is malformed (the message names the
                line) or holds no memories, or ``chunk_chars`` is less than 1.
            Exception: Whatever reading ``source`` raised; the call is cancelled and
                nothing is stored.
        """
        requests = _transfer.GuardedRequests(
            _transfer.import_requests(self._in(channel), source, chunk_chars)
        )
        with translate_rpc_errors():
            call = self._stub.Import.future(requests, timeout=self.timeout)
            requests.attach(call)
            try:
                response = call.result()
            except (grpc.RpcError, grpc.FutureCancelledError) as err:
                if requests.error is not None:
                    raise requests.error from None  # the source failed: the call was cancelled
                if isinstance(err, grpc.FutureCancelledError):
                    raise ServerError(grpc.StatusCode.CANCELLED, "import cancelled") from err
                raise
            finally:
                call.cancel()  # on Ctrl-C while waiting; a no-op once the call is done
        return list(response.ids)

    def health(self) -> str:
        """The server's overall health: ``"SERVING"`` or ``"NOT_SERVING"`` (while stopping)."""
        with translate_rpc_errors():
            # The health stubs declare HealthStub without its methods.
            response = self._health.Check(  # type: ignore[attr-defined, unused-ignore]
                health_pb2.HealthCheckRequest(service=""), timeout=self.timeout
            )
        return _enums.serving_status(response.status)

    # --- triggers and events --------------------------------------------------------

    def create_trigger(
        self,
        *,
        event: EnumArg,
        action: EnumArg,
        channel: str | None = None,
        trigger_id: str = "",
        **options: Unpack[TriggerOptions],
    ) -> trigger_service_pb2.Trigger:
        """Register a trigger: when ``event`` happens to a matching memory, do ``action``.

        Example::

            calor.create_trigger(
                event="on_store", action="notify", filter_pattern=r"(?i)deadline",
                config={"message": "deadline noted: {text}"},
            )

        Args:
            event: ``"on_store"``, ``"on_recall"``, ``"on_boost"`` or ``"on_decay"``
                (or an ``EventKind``).
            action: ``"notify"``, ``"boost"``, ``"pin"``, ``"tag"``, ``"deprecate"``,
                ``"webhook"`` or ``"chain"`` (or an ``ActionKind``).
            channel: The channel it watches, instead of the client's.
            trigger_id: Its id: 1-64 letters, digits or ``_.:-``; empty (the default)
                lets the server choose one.
            **options: Its action config, filters, limits and decay threshold: see
                :class:`~calor.client._convert_triggers.TriggerOptions`.

        Returns:
            The trigger as registered, with its id.

        Raises:
            InvalidArgumentError: An unknown event, action or type, a bad pattern,
                id or config.
        """
        request = _convert_triggers.trigger_request(
            self._in(channel), event, action, trigger_id, **options
        )
        with translate_rpc_errors():
            return self._triggers.CreateTrigger(request, timeout=self.timeout).trigger

    def list_triggers(self, *, channel: str | None = None) -> list[trigger_service_pb2.Trigger]:
        """The triggers of a channel, in id order, each with how often it has fired.

        Args:
            channel: The channel, instead of the client's; ``""`` lists every channel.

        Returns:
            Every trigger, fetched page by page.
        """
        request = trigger_service_pb2.ListTriggersRequest(channel=self._in(channel))
        triggers: list[trigger_service_pb2.Trigger] = []
        while True:
            with translate_rpc_errors():
                page = self._triggers.ListTriggers(request, timeout=self.timeout)
            triggers.extend(page.triggers)
            if not page.next_page_token:
                return triggers
            request.page_token = page.next_page_token

    def delete_trigger(self, trigger_id: str) -> None:
        """Remove a trigger; it fires no more (its history and logged events stay).

        Raises:
            NotFoundError: No trigger has that id.
        """
        request = trigger_service_pb2.DeleteTriggerRequest(id=trigger_id)
        with translate_rpc_errors():
            self._triggers.DeleteTrigger(request, timeout=self.timeout)

    def trigger_history(self, trigger_id: str) -> list[trigger_service_pb2.TriggerFiring]:
        """Every firing of a trigger, oldest first: when, on which memory, with what outcome."""
        request = trigger_service_pb2.TriggerHistoryRequest(trigger_id=trigger_id)
        firings: list[trigger_service_pb2.TriggerFiring] = []
        while True:
            with translate_rpc_errors():
                page = self._triggers.TriggerHistory(request, timeout=self.timeout)
            firings.extend(page.firings)
            if not page.next_page_token:
                return firings
            request.page_token = page.next_page_token

    def evaluate_triggers(
        self, event: EnumArg, memory_id: str, *, channel: str | None = None
    ) -> list[trigger_service_pb2.TriggerMatch]:
        """A dry run: the triggers that would fire now for ``event`` on a memory.

        Nothing fires and nothing changes. Each match holds the trigger and what it
        would do (``would``).

        Raises:
            NotFoundError: No memory has that id in the channel.
        """
        request = trigger_service_pb2.EvaluateTriggersRequest(
            channel=self._in(channel), event=_enums.parse_event(event), memory_id=memory_id
        )
        with translate_rpc_errors():
            response = self._triggers.EvaluateTriggers(request, timeout=self.timeout)
        return list(response.matches)

    def subscribe(
        self,
        *,
        channels: Iterable[str] = (),
        kinds: Iterable[EnumArg] = (),
        trigger_ids: Iterable[str] = (),
        after_seq: int = 0,
        resume: bool = True,
        from_oldest_retained: bool = False,
        backoff: Backoff | None = None,
    ) -> EventStream:
        """Stream logged events: first those the log holds after ``after_seq``, then live ones.

        Each event comes once, in sequence order. A filter left empty matches
        everything: ``channels=()`` is every channel the caller may read (pass
        ``[calor.channel]`` for the client's own). The stream has no deadline.

        When the server ends the stream because the caller fell behind
        (RESOURCE_EXHAUSTED) or it is going away or cannot be reached
        (UNAVAILABLE), the stream resubscribes by itself after the last event it
        yielded, so nothing is lost or repeated. By default it keeps trying for as
        long as the outage lasts, waiting 0.2 s doubling up to 10 s (less a random
        share of up to half) between attempts; pass ``backoff`` to change that or to
        give up after a number of failures in a row. Iterating blocks; close the
        stream (from any thread) or leave its ``with`` block to cancel the call.

        Example::

            with calor.subscribe(channels=["agent-7"], kinds=["notify"]) as events:
                for event in events:
                    print(event.seq, event.message)

        Args:
            channels: Only events of these channels.
            kinds: Only these kinds: ``"on_store"``, ``"notify"``, ``"dream"``, …
            trigger_ids: Only events caused by these triggers.
            after_seq: Start after this sequence number (0: the oldest event kept).
            resume: Resubscribe after RESOURCE_EXHAUSTED and UNAVAILABLE; with False
                those are raised like any other error.
            from_oldest_retained: If retention dropped events after ``after_seq``,
                start from the oldest event kept instead of raising
                :class:`~calor.client.errors.OutOfRangeError`.
            backoff: How to wait between resubscriptions and how many failures in a
                row to allow (:class:`~calor.client.Backoff`); None: the default,
                which retries for ever.

        Returns:
            An iterator of ``Event`` messages; its ``last_seq`` is the resume point.

        Raises:
            InvalidArgumentError: An unknown kind or a negative ``after_seq`` (at
                once); a channel the server rejects (when iterating).
            OutOfRangeError: When iterating: ``after_seq`` (or the resume point after
                an outage) is past the end of the server's log, or retention dropped
                events after it; ``last_seq`` or ``oldest_seq`` names the bound.
        """
        request = _convert_triggers.subscribe_request(channels, kinds, trigger_ids, after_seq)
        request.from_oldest_retained = from_oldest_retained
        return EventStream(
            lambda req: self._triggers.Subscribe(req, timeout=None),
            Resumer(request, resume=resume, backoff=backoff),
        )

"""The synchronous Calor client: typed methods over the Memory, Settings and Trigger services."""

from __future__ import annotations

from collections.abc import Generator, Iterable, Iterator
from typing import Self, Unpack

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from calor.client import _convert, _enums, _transfer
from calor.client._client_services import SettingsCalls, TriggerCalls
from calor.client._convert import (
    ContextOptions,
    ForgetOptions,
    ListOptions,
    RecallOptions,
    StoreOptions,
    UpdateOptions,
)
from calor.client._credentials import (
    ChannelSecurity,
    PemSource,
    open_channel,
    target_and_channel,
)
from calor.client._enums import EnumArg
from calor.client._subscription import EventStream
from calor.client._transfer import DEFAULT_CHUNK_CHARS, MarkdownSource
from calor.client.errors import ServerError, translate_rpc_errors
from calor.v1 import (
    memory_pb2,
    memory_service_pb2,
    memory_service_pb2_grpc,
    settings_service_pb2_grpc,
    trigger_service_pb2_grpc,
)

__all__ = ["CalorClient", "EventStream"]


class CalorClient(SettingsCalls, TriggerCalls):
    """A blocking client of one Calor server, working in one default channel.

    Making one does no I/O: the gRPC channel connects on the first call. Every
    failed call raises a :class:`~calor.client.errors.CalorClientError`.

    Example::

        with CalorClient("localhost:50051", channel="agent-7") as calor:
            memory = calor.store("The user is allergic to peanuts.", memory_type="core")
            hits = calor.recall("what is the user allergic to?").hits

    Over TLS, with a key::

        CalorClient("calor.example:50051", api_key=key, tls_ca="ca.pem")

    Args:
        target: The server's ``host:port``; None reads ``$CALOR_TARGET`` (unset:
            ``localhost:50051``), as the CLI and ``calor mcp`` do.
        channel: The memory channel calls use unless they pass ``channel=``; None reads
            ``$CALOR_CHANNEL`` (unset: ``default``).
        timeout: Seconds each call may take; None waits for ever.
        api_key: The API key sent with every call, streams included, as
            ``authorization: Bearer KEY``; None reads ``$CALOR_API_KEY`` (unset: no key).
        tls: Speak TLS, trusting the system's root certificates.
        tls_ca: Speak TLS trusting these CA certificates instead: a PEM file's path,
            or PEM bytes; None reads the path in ``$CALOR_TLS_CA`` (unset: none).
        tls_cert: A client certificate (path or PEM bytes) for a server that asks
            for one (mutual TLS); implies TLS. With ``tls_key``, None for both reads
            ``$CALOR_TLS_CLIENT_CERT`` and ``$CALOR_TLS_CLIENT_KEY``.
        tls_key: The client certificate's private key (path or PEM bytes).
        grpc_channel: A ready ``grpc.Channel`` to use instead of one the client
            opens (for interceptors of your own); it carries its own credentials, so
            ``api_key`` and the ``tls`` arguments must be left out. The caller keeps
            it: :meth:`close` leaves it open.

    Raises:
        InvalidArgumentError: The key or a PEM argument is malformed, or ``tls_cert``
            comes without ``tls_key``.
        OSError: A certificate or key file cannot be read.
    """

    def __init__(
        self,
        target: str | None = None,
        *,
        channel: str | None = None,
        timeout: float | None = 30.0,
        api_key: str | None = None,
        tls: bool = False,
        tls_ca: PemSource | None = None,
        tls_cert: PemSource | None = None,
        tls_key: PemSource | None = None,
        grpc_channel: grpc.Channel | None = None,
    ) -> None:
        super().__init__(*target_and_channel(target, channel), timeout)
        security = (api_key, tls_ca, tls_cert, tls_key)
        self._owns_channel = grpc_channel is None
        if grpc_channel is None:
            grpc_channel = open_channel(
                self.target,
                ChannelSecurity.of(
                    api_key=api_key, tls=tls, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key
                ),
            )
        elif tls or any(value is not None for value in security):
            raise TypeError("grpc_channel carries its own credentials: no api_key or tls_*")
        self._grpc_channel = grpc_channel
        self._stub = memory_service_pb2_grpc.MemoryServiceStub(self._grpc_channel)
        self._triggers = trigger_service_pb2_grpc.TriggerServiceStub(self._grpc_channel)
        self._settings = settings_service_pb2_grpc.SettingsServiceStub(self._grpc_channel)
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
        progress_token: str = "",
        **options: Unpack[StoreOptions],
    ) -> list[str]:
        """Store many memories in one stream, embedded in batches on the server.

        Args:
            items: Texts, which take the options below, or whole ``StoreRequest``
                messages, sent as they are (in ``channel`` if they name none).
            channel: The channel to store in, instead of the client's.
            progress_token: A token under which the server counts the stream's
                progress, for :meth:`progress` (see :meth:`import_markdown`).
            **options: As for :meth:`store`, for the text items: see
                :class:`~calor.client._convert.StoreOptions`.

        Returns:
            The new ids, in the order of ``items``.
        """
        messages = _convert.stream_requests(self._in(channel), items, **options)
        if not messages:
            return []
        messages[0].progress_token = progress_token
        with translate_rpc_errors():
            return list(self._stub.StoreStream(iter(messages), timeout=self.timeout).ids)

    def progress(
        self, progress_token: str, *, channel: str | None = None
    ) -> memory_service_pb2.ProgressResponse:
        """How far a :meth:`store_many` or :meth:`import_markdown` given this
        ``progress_token`` has come: items received, embedded and stored, the total
        once the stream has ended, and its phase (``receiving``, ``embedding``,
        ``storing``, ``done``, ``failed``). A finished call's counts stay readable a
        few minutes; :class:`~calor.client.errors.NotFoundError` after that, or for a
        token no call named."""
        request = memory_service_pb2.ProgressRequest(
            channel=self._in(channel), progress_token=progress_token
        )
        with translate_rpc_errors():
            return self._stub.Progress(request, timeout=self.timeout)

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
        self, memory_id: str, *, channel: str | None = None, heat_curve: bool = False
    ) -> memory_service_pb2.InspectResponse:
        """One memory, in any state, and its graph edges; with ``heat_curve``, also its
        heat over time (past and projected) and the moments it reaches its floor, turns
        cold and moves to cold storage.

        Raises:
            NotFoundError: No memory has that id in the channel.
        """
        request = memory_service_pb2.InspectRequest(
            channel=self._in(channel), id=memory_id, heat_curve=heat_curve
        )
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

    def list_channels(self, prefix: str = "") -> list[str]:
        """The names of every channel this client's key may read that holds anything
        (those starting with ``prefix``), in name order, fetched page by page."""
        request = memory_service_pb2.ListChannelsRequest(prefix=prefix, page_size=1000)
        names: list[str] = []
        while True:
            with translate_rpc_errors():
                page = self._stub.ListChannels(request, timeout=self.timeout)
            names.extend(page.channels)
            if not page.next_page_token:
                return names
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

    def forget(
        self,
        ids: str | Iterable[str] = (),
        *,
        channel: str | None = None,
        reject: bool = False,
        **filters: Unpack[ForgetOptions],
    ) -> int:
        """Forget memories by id, and every memory a filter matches; they leave no trace.

        Example::

            calor.forget(memory_types=["working"], created_before=datetime(2026, 1, 1))
            calor.forget(wrong_id, reject=True)  # and do not learn it again

        Args:
            ids: One id or many.
            channel: Their channel, instead of the client's.
            reject: Keep each one's embedding (not its text) as a rejection: a later
                store close to it is stored with the near-duplicate penalty and
                provenance ``resembles_rejected`` naming it.
            **filters: Types, states, tags and ``created_before``; a memory must match
                every filter given: see :class:`~calor.client._convert.ForgetOptions`.

        Returns:
            How many memories were forgotten.

        Raises:
            InvalidArgumentError: Neither ids nor a filter were given.
        """
        request = _convert.forget_request(self._in(channel), ids, reject, **filters)
        with translate_rpc_errors():
            return int(self._stub.Forget(request, timeout=self.timeout).forgotten)

    def connect(
        self, from_id: str, to_id: str, *, weight: float = 0.0, channel: str | None = None
    ) -> memory_pb2.Edge:
        """Link two memories of a channel by hand: a ``manual`` edge, which recall's graph
        context and resonance follow like any other.

        Args:
            from_id: The memory the edge starts from.
            to_id: The memory it leads to.
            weight: The edge's weight, 0..1; 0 (the default) means 1.0.
            channel: Their channel, instead of the client's.

        Returns:
            The edge.

        Raises:
            NotFoundError: Either memory is not in the channel, or was forgotten.
        """
        request = memory_service_pb2.ConnectRequest(
            channel=self._in(channel), from_id=from_id, to_id=to_id, weight=weight
        )
        with translate_rpc_errors():
            return self._stub.Connect(request, timeout=self.timeout).edge

    def drop_channel(self, channel: str) -> int:
        """Remove a whole channel: its memories, triggers, settings and logs, and the text
        its events quoted (an admin call under access control). The channel is named
        explicitly, never the client's default.

        Returns:
            How many memories it held (forgotten ones included); 0 for a channel that
            holds nothing, so a retry is harmless.
        """
        request = memory_service_pb2.DropChannelRequest(channel=channel)
        with translate_rpc_errors():
            return int(self._stub.DropChannel(request, timeout=self.timeout).dropped)

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

    def dream(
        self, *, channel: str | None = None, progress_token: str = ""
    ) -> memory_service_pb2.DreamResponse:
        """Consolidate a channel now: migrate, merge, promote, prune, archive.

        With a ``progress_token``, :meth:`progress` tells the step under way while it runs
        (``step`` of ``steps``, named by ``phase``).

        Returns:
            The dream report: how many memories each step changed, the channel's
            heat before and after, and how long it took.
        """
        request = memory_service_pb2.DreamRequest(
            channel=self._in(channel), progress_token=progress_token
        )
        with translate_rpc_errors():
            return self._stub.Dream(request, timeout=self.timeout)

    def offer(
        self, entropy: bytes | str, *, channel: str | None = None
    ) -> memory_service_pb2.OfferResponse:
        """Offer what a channel took in (a transcript, a document: text is sent as UTF-8);
        only its size counts. When the bytes offered since the last dream reach the
        channel's ``entropy_threshold``, the channel dreams now.

        Returns:
            The bytes accumulated towards the next dream, whether this offer made the
            channel dream, and that dream's report.
        """
        data = entropy.encode() if isinstance(entropy, str) else entropy
        request = memory_service_pb2.OfferRequest(channel=self._in(channel), entropy=data)
        with translate_rpc_errors():
            return self._stub.Offer(request, timeout=self.timeout)

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
        remap_ids: bool = False,
        progress_token: str = "",
    ) -> list[str]:
        """Import the memories that Markdown holds: an export, or a plain list of notes.

        The text streams to the server in chunks of ``chunk_chars`` characters, read
        from ``source`` as they are sent. The import is all or nothing: on bad input
        nothing is stored. The client's ``timeout`` bounds the whole call.

        Exported memories come back as they were (heat, stability, recalls, state,
        provenance, and the edges among them) under their exported ids, unless
        ``remap_ids`` gives them new ones; notes and older exports are stored anew.

        Example::

            with open("agent-7.md", encoding="utf-8", newline="") as notes:
                ids = calor.import_markdown(notes, channel="agent-7-copy")

        Args:
            source: The Markdown: the whole text, or its pieces in order (an open text
                file yields its lines; open it with ``newline=""`` so that a lone
                ``"\r"`` in a memory's text survives).
            channel: The channel to import into, instead of the client's.
            chunk_chars: Characters per message, at least 1.
            remap_ids: Give every imported memory a new id (the references among them
                rewritten to match), e.g. to import an export into its own channel.
            progress_token: A token of your choosing (1-64 of A-Z a-z 0-9 _-) under
                which the server counts the import's progress, for :meth:`progress`
                from another thread while this call runs.

        Returns:
            The imported memories' ids, in document order.

        Raises:
            InvalidArgumentError: The Markdown is malformed (the message names the
                line) or holds no memories, or ``chunk_chars`` is less than 1.
            ServerError: ``ALREADY_EXISTS`` without ``remap_ids``: the channel holds
                one of the exported ids already (the message names it); nothing is
                imported.
            Exception: Whatever reading ``source`` raised; the call is cancelled and
                nothing is stored.
        """
        requests = _transfer.GuardedRequests(
            _transfer.import_requests(
                self._in(channel), source, chunk_chars, remap_ids, progress_token
            )
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

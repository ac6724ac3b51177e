"""The asyncio Calor client: the methods of ``CalorClient``, awaitable, over ``grpc.aio``."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Iterable
from contextlib import aclosing
from typing import Self, Unpack

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from calor.client import _convert, _convert_settings, _convert_triggers, _enums, _transfer
from calor.client._convert import (
    ContextOptions,
    ForgetOptions,
    ListOptions,
    RecallOptions,
    StoreOptions,
    UpdateOptions,
)
from calor.client._convert_triggers import TriggerOptions
from calor.client._credentials import (
    ChannelSecurity,
    PemSource,
    open_aio_channel,
    target_and_channel,
)
from calor.client._enums import EnumArg
from calor.client._subscription import AsyncEventStream, Backoff, Resumer
from calor.client._transfer import DEFAULT_CHUNK_CHARS, MarkdownSource
from calor.client.errors import translate_rpc_errors
from calor.v1 import (
    memory_pb2,
    memory_service_pb2,
    memory_service_pb2_grpc,
    settings_service_pb2,
    settings_service_pb2_grpc,
    trigger_service_pb2,
    trigger_service_pb2_grpc,
)

__all__ = ["AsyncCalorClient"]


class AsyncCalorClient(_convert.ClientBase):
    """An asyncio client of one Calor server, working in one default channel.

    It mirrors :class:`~calor.client.CalorClient` method for method; see there for
    what each argument means. Make it inside the event loop that will use it.
    Making one does no I/O, and every failed call raises a
    :class:`~calor.client.errors.CalorClientError`.

    Example::

        async with AsyncCalorClient("localhost:50051", channel="agent-7") as calor:
            await calor.store("The user is allergic to peanuts.", memory_type="core")
            hits = (await calor.recall("allergies")).hits

    Args:
        target: The server's ``host:port``; None reads ``$CALOR_TARGET`` (unset:
            ``localhost:50051``), as the CLI and ``calor mcp`` do.
        channel: The memory channel calls use unless they pass ``channel=``; None reads
            ``$CALOR_CHANNEL`` (unset: ``default``).
        timeout: Seconds each call may take; None waits for ever.
        api_key: The API key sent with every call; None reads ``$CALOR_API_KEY``.
        tls: Speak TLS, trusting the system's root certificates.
        tls_ca: Speak TLS trusting these CA certificates (path or PEM bytes); None
            reads the path in ``$CALOR_TLS_CA``.
        tls_cert: A client certificate for mutual TLS (path or PEM bytes); with
            ``tls_key``, None for both reads ``$CALOR_TLS_CLIENT_CERT`` and
            ``$CALOR_TLS_CLIENT_KEY``.
        tls_key: Its private key (path or PEM bytes).
        grpc_channel: A ready ``grpc.aio.Channel`` to use instead of one the client
            opens; it carries its own credentials, so ``api_key`` and the ``tls``
            arguments must be left out. The caller keeps it: :meth:`close` leaves it
            open.

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
        grpc_channel: grpc.aio.Channel | None = None,
    ) -> None:
        super().__init__(*target_and_channel(target, channel), timeout)
        security = (api_key, tls_ca, tls_cert, tls_key)
        self._owns_channel = grpc_channel is None
        if grpc_channel is None:
            grpc_channel = open_aio_channel(
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

    async def close(self) -> None:
        """Close the gRPC channel the client made (not one it was given)."""
        if self._owns_channel:
            await self._grpc_channel.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def store(
        self,
        text: str,
        *,
        channel: str | None = None,
        idempotency_key: str | None = None,
        **options: Unpack[StoreOptions],
    ) -> memory_pb2.Memory:
        """Store one memory; see :meth:`CalorClient.store`."""
        request = _convert.store_request(self._in(channel), text, idempotency_key, **options)
        with translate_rpc_errors():
            return (await self._stub.Store(request, timeout=self.timeout)).memory

    async def store_many(
        self,
        items: Iterable[str | memory_service_pb2.StoreRequest],
        *,
        channel: str | None = None,
        progress_token: str = "",
        **options: Unpack[StoreOptions],
    ) -> list[str]:
        """Store many memories in one stream; see :meth:`CalorClient.store_many`."""
        messages = _convert.stream_requests(self._in(channel), items, **options)
        if not messages:
            return []
        messages[0].progress_token = progress_token
        with translate_rpc_errors():
            response = await self._stub.StoreStream(iter(messages), timeout=self.timeout)
        return list(response.ids)

    async def progress(
        self, progress_token: str, *, channel: str | None = None
    ) -> memory_service_pb2.ProgressResponse:
        """How far a write given this token has come; see :meth:`CalorClient.progress`."""
        request = memory_service_pb2.ProgressRequest(
            channel=self._in(channel), progress_token=progress_token
        )
        with translate_rpc_errors():
            return await self._stub.Progress(request, timeout=self.timeout)

    async def recall(
        self, query: str, *, channel: str | None = None, **options: Unpack[RecallOptions]
    ) -> memory_service_pb2.RecallResponse:
        """Find the memories that answer a query; see :meth:`CalorClient.recall`."""
        request = _convert.recall_request(self._in(channel), query, **options)
        with translate_rpc_errors():
            return await self._stub.Recall(request, timeout=self.timeout)

    async def inspect(
        self, memory_id: str, *, channel: str | None = None, heat_curve: bool = False
    ) -> memory_service_pb2.InspectResponse:
        """One memory and its edges; see :meth:`CalorClient.inspect`."""
        request = memory_service_pb2.InspectRequest(
            channel=self._in(channel), id=memory_id, heat_curve=heat_curve
        )
        with translate_rpc_errors():
            return await self._stub.Inspect(request, timeout=self.timeout)

    async def list_memories(
        self,
        *,
        channel: str | None = None,
        page_token: str = "",
        **options: Unpack[ListOptions],
    ) -> memory_service_pb2.ListMemoriesResponse:
        """One page of a channel's memories; see :meth:`CalorClient.list_memories`."""
        request = _convert.list_request(self._in(channel), page_token, **options)
        with translate_rpc_errors():
            return await self._stub.ListMemories(request, timeout=self.timeout)

    async def iter_memories(
        self, *, channel: str | None = None, **options: Unpack[ListOptions]
    ) -> AsyncIterator[memory_pb2.Memory]:
        """Every memory across pages; see :meth:`CalorClient.iter_memories`."""
        request = _convert.list_request(self._in(channel), "", **options)
        while True:
            with translate_rpc_errors():
                page = await self._stub.ListMemories(request, timeout=self.timeout)
            for memory in page.memories:
                yield memory
            if not page.next_page_token:
                return
            request.page_token = page.next_page_token

    async def list_channels(self, prefix: str = "") -> list[str]:
        """The readable channels' names; see :meth:`CalorClient.list_channels`."""
        request = memory_service_pb2.ListChannelsRequest(prefix=prefix, page_size=1000)
        names: list[str] = []
        while True:
            with translate_rpc_errors():
                page = await self._stub.ListChannels(request, timeout=self.timeout)
            names.extend(page.channels)
            if not page.next_page_token:
                return names
            request.page_token = page.next_page_token

    async def update(
        self, memory_id: str, *, channel: str | None = None, **options: Unpack[UpdateOptions]
    ) -> memory_pb2.Memory:
        """Correct the fields given of a memory; see :meth:`CalorClient.update`."""
        request = _convert.update_request(self._in(channel), memory_id, **options)
        with translate_rpc_errors():
            return (await self._stub.Update(request, timeout=self.timeout)).memory

    async def keystone(
        self, memory_id: str, on: bool = True, *, channel: str | None = None
    ) -> memory_pb2.Memory:
        """Pin or unpin a memory as a keystone; see :meth:`CalorClient.keystone`."""
        request = memory_service_pb2.KeystoneRequest(
            channel=self._in(channel), id=memory_id, keystone=on
        )
        with translate_rpc_errors():
            return (await self._stub.Keystone(request, timeout=self.timeout)).memory

    async def boost(
        self, memory_id: str, delta: float = 0.0, *, channel: str | None = None
    ) -> memory_pb2.Memory:
        """Add heat to a memory; see :meth:`CalorClient.boost`."""
        request = memory_service_pb2.BoostRequest(
            channel=self._in(channel), id=memory_id, delta=delta
        )
        with translate_rpc_errors():
            return (await self._stub.Boost(request, timeout=self.timeout)).memory

    async def forget(
        self,
        ids: str | Iterable[str] = (),
        *,
        channel: str | None = None,
        reject: bool = False,
        **filters: Unpack[ForgetOptions],
    ) -> int:
        """Forget memories by id and by filter; see :meth:`CalorClient.forget`."""
        request = _convert.forget_request(self._in(channel), ids, reject, **filters)
        with translate_rpc_errors():
            return int((await self._stub.Forget(request, timeout=self.timeout)).forgotten)

    async def connect(
        self, from_id: str, to_id: str, *, weight: float = 0.0, channel: str | None = None
    ) -> memory_pb2.Edge:
        """Link two memories by hand; see :meth:`CalorClient.connect`."""
        request = memory_service_pb2.ConnectRequest(
            channel=self._in(channel), from_id=from_id, to_id=to_id, weight=weight
        )
        with translate_rpc_errors():
            return (await self._stub.Connect(request, timeout=self.timeout)).edge

    async def drop_channel(self, channel: str) -> int:
        """Remove a whole channel; see :meth:`CalorClient.drop_channel`."""
        request = memory_service_pb2.DropChannelRequest(channel=channel)
        with translate_rpc_errors():
            return int((await self._stub.DropChannel(request, timeout=self.timeout)).dropped)

    async def identity(self, *, channel: str | None = None) -> memory_service_pb2.IdentityResponse:
        """The channel's status; see :meth:`CalorClient.identity`."""
        request = memory_service_pb2.IdentityRequest(channel=self._in(channel))
        with translate_rpc_errors():
            return await self._stub.Identity(request, timeout=self.timeout)

    async def feedback(
        self,
        recall_id: str,
        rating: EnumArg,
        memory_ids: str | Iterable[str] = (),
        *,
        channel: str | None = None,
    ) -> memory_service_pb2.FeedbackResponse:
        """Say whether a recall helped; see :meth:`CalorClient.feedback`."""
        request = _convert.feedback_request(self._in(channel), recall_id, rating, memory_ids)
        with translate_rpc_errors():
            return await self._stub.Feedback(request, timeout=self.timeout)

    async def tune(
        self, *, channel: str | None = None, dry_run: bool = False
    ) -> memory_service_pb2.TuneResponse:
        """Fit the channel's recall weights to its feedback; see :meth:`CalorClient.tune`."""
        request = _convert.tune_request(self._in(channel), dry_run)
        with translate_rpc_errors():
            return await self._stub.Tune(request, timeout=self.timeout)

    async def context(
        self, message: str, *, channel: str | None = None, **options: Unpack[ContextOptions]
    ) -> memory_service_pb2.ContextResponse:
        """The block to prepend to a prompt; see :meth:`CalorClient.context`."""
        request = _convert.context_request(self._in(channel), message, **options)
        with translate_rpc_errors():
            return await self._stub.Context(request, timeout=self.timeout)

    async def evaluate(
        self, text: str, *, channel: str | None = None, store_findings: bool = False
    ) -> memory_service_pb2.EvaluateResponse:
        """Check a text against the channel's memories; see :meth:`CalorClient.evaluate`."""
        request = memory_service_pb2.EvaluateRequest(
            channel=self._in(channel), text=text, store_findings=store_findings
        )
        with translate_rpc_errors():
            return await self._stub.Evaluate(request, timeout=self.timeout)

    async def share(
        self, memory_id: str, target_channel: str, *, channel: str | None = None
    ) -> memory_pb2.Memory:
        """Copy a memory into another channel; see :meth:`CalorClient.share`."""
        request = memory_service_pb2.ShareRequest(
            channel=self._in(channel), id=memory_id, target_channel=target_channel
        )
        with translate_rpc_errors():
            return (await self._stub.Share(request, timeout=self.timeout)).memory

    async def entity_card(
        self, entity: str, *, channel: str | None = None
    ) -> memory_service_pb2.EntityCardResponse:
        """An entity's card; see :meth:`CalorClient.entity_card`."""
        request = memory_service_pb2.EntityCardRequest(channel=self._in(channel), entity=entity)
        with translate_rpc_errors():
            return await self._stub.EntityCard(request, timeout=self.timeout)

    async def dream(
        self, *, channel: str | None = None, progress_token: str = ""
    ) -> memory_service_pb2.DreamResponse:
        """Consolidate a channel now; see :meth:`CalorClient.dream`."""
        request = memory_service_pb2.DreamRequest(
            channel=self._in(channel), progress_token=progress_token
        )
        with translate_rpc_errors():
            return await self._stub.Dream(request, timeout=self.timeout)

    async def offer(
        self, entropy: bytes | str, *, channel: str | None = None
    ) -> memory_service_pb2.OfferResponse:
        """Offer what a channel took in; see :meth:`CalorClient.offer`."""
        data = entropy.encode() if isinstance(entropy, str) else entropy
        request = memory_service_pb2.OfferRequest(channel=self._in(channel), entropy=data)
        with translate_rpc_errors():
            return await self._stub.Offer(request, timeout=self.timeout)

    async def export(
        self, *, channel: str | None = None, include_archived: bool = False
    ) -> AsyncGenerator[memory_service_pb2.ExportResponse, None]:
        """Stream a channel out as Markdown, header first; see :meth:`CalorClient.export`.

        Use it with ``async for``; ``aclose()`` before the end cancels the call.
        """
        request = _transfer.export_request(self._in(channel), include_archived)
        call = self._stub.Export(request, timeout=self.timeout)
        try:
            with translate_rpc_errors():
                async for response in call:
                    yield response
        finally:
            call.cancel()  # a no-op once the stream has ended

    async def import_markdown(
        self,
        source: MarkdownSource | AsyncIterable[str],
        *,
        channel: str | None = None,
        chunk_chars: int = DEFAULT_CHUNK_CHARS,
        remap_ids: bool = False,
        progress_token: str = "",
    ) -> list[str]:
        """Import the memories that Markdown holds, all or nothing.

        See :meth:`CalorClient.import_markdown`; ``source`` may also be an async
        iterable of pieces (a plain iterable is read on the event loop). If reading
        it raises, the call is cancelled, nothing is stored, and the error propagates.
        """
        requests = _transfer.aimport_requests(
            self._in(channel), source, chunk_chars, remap_ids, progress_token
        )
        call = self._stub.Import(timeout=self.timeout)
        try:
            async with aclosing(requests):
                with translate_rpc_errors():
                    async for request in requests:
                        if call.done():  # the server has answered (refused) already
                            break
                        await call.write(request)
                    await call.done_writing()  # does nothing once the call is done
                    response = await call
        finally:
            call.cancel()  # when reading the source failed; a no-op once the call is done
        return list(response.ids)

    async def health(self) -> str:
        """The server's overall health: ``"SERVING"`` or ``"NOT_SERVING"``."""
        with translate_rpc_errors():
            # The health stubs declare HealthStub without its methods.
            response = await self._health.Check(  # type: ignore[attr-defined, unused-ignore]
                health_pb2.HealthCheckRequest(service=""), timeout=self.timeout
            )
        return _enums.serving_status(response.status)

    async def get_settings(self, *, channel: str | None = None) -> memory_pb2.ChannelSettings:
        """The settings in force in a channel; see :meth:`CalorClient.get_settings`."""
        request = settings_service_pb2.GetSettingsRequest(channel=self._in(channel))
        with translate_rpc_errors():
            return (await self._settings.GetSettings(request, timeout=self.timeout)).settings

    async def update_settings(
        self, *, channel: str | None = None, **fields: object
    ) -> memory_pb2.ChannelSettings:
        """Change the settings named; see :meth:`CalorClient.update_settings`."""
        request = _convert_settings.settings_request(self._in(channel), fields)
        with translate_rpc_errors():
            return (await self._settings.UpdateSettings(request, timeout=self.timeout)).settings

    async def status(self) -> settings_service_pb2.ServerStatusResponse:
        """How the whole server is doing (see :meth:`CalorClient.status`)."""
        stub = settings_service_pb2_grpc.SettingsServiceStub(self._grpc_channel)
        request = settings_service_pb2.ServerStatusRequest()
        with translate_rpc_errors():
            return await stub.ServerStatus(request, timeout=self.timeout)

    # --- triggers and events --------------------------------------------------------

    async def create_trigger(
        self,
        *,
        event: EnumArg,
        action: EnumArg,
        channel: str | None = None,
        trigger_id: str = "",
        **options: Unpack[TriggerOptions],
    ) -> trigger_service_pb2.Trigger:
        """Register a trigger; see :meth:`CalorClient.create_trigger`."""
        request = _convert_triggers.trigger_request(
            self._in(channel), event, action, trigger_id, **options
        )
        with translate_rpc_errors():
            return (await self._triggers.CreateTrigger(request, timeout=self.timeout)).trigger

    async def list_triggers(
        self, *, channel: str | None = None
    ) -> list[trigger_service_pb2.Trigger]:
        """Every trigger of a channel (``""``: of all); see :meth:`CalorClient.list_triggers`."""
        request = trigger_service_pb2.ListTriggersRequest(channel=self._in(channel))
        triggers: list[trigger_service_pb2.Trigger] = []
        while True:
            with translate_rpc_errors():
                page = await self._triggers.ListTriggers(request, timeout=self.timeout)
            triggers.extend(page.triggers)
            if not page.next_page_token:
                return triggers
            request.page_token = page.next_page_token

    async def delete_trigger(self, trigger_id: str) -> None:
        """Remove a trigger; see :meth:`CalorClient.delete_trigger`."""
        request = trigger_service_pb2.DeleteTriggerRequest(id=trigger_id)
        with translate_rpc_errors():
            await self._triggers.DeleteTrigger(request, timeout=self.timeout)

    async def trigger_history(
        self, trigger_id: str, *, latest: int = 0
    ) -> list[trigger_service_pb2.TriggerFiring]:
        """Every firing of a trigger, oldest first, or its ``latest`` newest first; see
        :meth:`CalorClient.trigger_history`."""
        request = trigger_service_pb2.TriggerHistoryRequest(trigger_id=trigger_id)
        if latest:
            request.page_size, request.newest_first = latest, True
            with translate_rpc_errors():
                page = await self._triggers.TriggerHistory(request, timeout=self.timeout)
            return list(page.firings)
        firings: list[trigger_service_pb2.TriggerFiring] = []
        while True:
            with translate_rpc_errors():
                page = await self._triggers.TriggerHistory(request, timeout=self.timeout)
            firings.extend(page.firings)
            if not page.next_page_token:
                return firings
            request.page_token = page.next_page_token

    async def trigger_feedback(
        self, trigger_id: str, cause_seq: int, rating: EnumArg, *, channel: str | None = None
    ) -> trigger_service_pb2.Trigger:
        """Rate one firing of a trigger; see :meth:`CalorClient.trigger_feedback`."""
        request = _convert_triggers.feedback_request(
            self._in(channel), trigger_id, cause_seq, rating
        )
        with translate_rpc_errors():
            return (await self._triggers.TriggerFeedback(request, timeout=self.timeout)).trigger

    async def evaluate_triggers(
        self, event: EnumArg, memory_id: str, *, channel: str | None = None
    ) -> list[trigger_service_pb2.TriggerMatch]:
        """A dry run of the triggers; see :meth:`CalorClient.evaluate_triggers`."""
        request = trigger_service_pb2.EvaluateTriggersRequest(
            channel=self._in(channel), event=_enums.parse_event(event), memory_id=memory_id
        )
        with translate_rpc_errors():
            response = await self._triggers.EvaluateTriggers(request, timeout=self.timeout)
        return list(response.matches)

    def subscribe(
        self,
        *,
        channels: Iterable[str] | None = None,
        kinds: Iterable[EnumArg] = (),
        trigger_ids: Iterable[str] = (),
        after_seq: int | None = None,
        resume: bool = True,
        from_oldest_retained: bool = False,
        backoff: Backoff | None = None,
        until_seq: int = 0,
    ) -> AsyncEventStream:
        """Stream the client's channel's events from now on (or as told), resuming by
        itself; see :meth:`CalorClient.subscribe`.

        Use it with ``async for``; the filter is checked at once. A stream from now
        starts when it is awaited (``events = await calor.subscribe()`` returns once
        the server has opened it: every event logged after that is delivered), or,
        not awaited, at its first ``anext``. Cancelling the task that iterates, or
        ``aclose()`` on the stream, cancels the call underneath.

        Example::

            async for event in await calor.subscribe():
                print(event.seq, event.message)
        """
        request = _convert_triggers.subscribe_request(
            self.channel, channels, kinds, trigger_ids, after_seq, from_oldest_retained
        )
        request.until_seq = until_seq
        return AsyncEventStream(
            lambda req: self._triggers.Subscribe(req, timeout=None),
            Resumer(request, resume=resume, backoff=backoff),
        )

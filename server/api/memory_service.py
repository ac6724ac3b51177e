"""MemoryService: thin async servicers — validate, hand to the engine, convert the reply."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

import grpc
import numpy as np

from calor.server.api import caller
from calor.server.api.answer_room import hits_that_fit, messages_that_fit
from calor.server.api.convert import (
    card_message,
    context_message,
    dream_message,
    edge_message,
    evaluation_message,
    feedback_message,
    foreign_hit,
    heat_curve_message,
    hit_message,
    memory_message,
    shared_source,
    status_message,
    tune_message,
    type_feedback,
    utility_factor_messages,
    window_message,
)
from calor.server.api.forwarding import FORWARDED_BY
from calor.server.api.grants import Permission
from calor.server.api.progress import ProgressBoard, WriteProgress, progress_token
from calor.server.api.routing import GATHERED, query_vector
from calor.server.api.rpc import abort_with, rpc_errors
from calor.server.api.runtime import Runtime
from calor.server.api.settings import settings_message
from calor.server.api.stream_store import StreamStore
from calor.server.api.wire import decode_page_token, encode_page_token, timestamp_message
from calor.server.commands import ListQuery, NewMemory, PackedItems
from calor.server.embedding import BatchEmbedding
from calor.server.engine.dream_report import DREAM_STEPS
from calor.server.engine.feedback import feedback_summary
from calor.server.engine.recall_log import ForeignHit
from calor.server.engine.results import Current, Stored
from calor.server.engine.share import shared_copy
from calor.server.errors import CalorError, InvalidArgumentError
from calor.server.recall.ranking import Hit
from calor.server.stages import stage
from calor.server.storage.markdown import (
    MarkdownReader,
    ParsedMemory,
    render_header,
    render_memory,
    to_new_memory,
)
from calor.server.thermo.channel_state import active_gates
from calor.v1 import memory_pb2, memory_service_pb2_grpc
from calor.v1 import memory_service_pb2 as pb

__all__ = ["MemoryServicer"]

_EXPORT_PAGE = 200

_Context = grpc.aio.ServicerContext[Any, Any]


class MemoryServicer(memory_service_pb2_grpc.MemoryServiceServicer):
    """The gRPC face of the memory engine."""

    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime
        self._progress = ProgressBoard()

    @staticmethod
    def _memory(current: Current | Stored) -> memory_pb2.Memory:
        """A memory as the caller may see it: whole, or without its content when the
        caller's key may not read its channel (write does not include read)."""
        readable = caller.grants().allows(current.record.channel, Permission.READ)
        return memory_message(current.record, current.heat, readable)

    async def _store(self, items: list[NewMemory]) -> list[Stored]:
        engine = self._rt.engine
        vectors = await self._rt.embeddings.passages([item.text for item in items])
        return await self._rt.run(engine.store, items, vectors)

    @rpc_errors
    async def Store(self, request: pb.StoreRequest, context: _Context) -> pb.StoreResponse:
        item = self._rt.validator.store(request)
        earlier = await self._rt.run(
            self._rt.engine.channels.find_idempotent, item.channel, item.idempotency_key
        )
        if earlier is not None:
            return pb.StoreResponse(memory=self._memory(earlier))
        [stored] = await self._store([item])
        return pb.StoreResponse(memory=self._memory(stored))

    async def StoreStream(
        self, request_iterator: AsyncIterator[pb.StoreStreamRequest], context: _Context
    ) -> pb.StoreStreamResponse:
        """All or nothing: items are validated and embedded as they arrive, and built into
        one batch a part at a time meanwhile; the batch is written in one atomic write
        once the last item is in, so a bad item leaves the channel unchanged."""
        progress = WriteProgress()
        engine = self._rt.engine
        stream = StreamStore(self._rt.run, engine.staged(), engine.store_all)
        try:
            items, vectors = await self._receive(request_iterator, progress, stream)
            progress.phase = "storing"
            ids = await stream.finish(items, vectors)
        except CalorError as error:
            stream.abandon()
            progress.end("failed")
            await abort_with(context, error)
            raise  # unreachable: abort raises
        except BaseException:
            stream.abandon()
            raise
        progress.stored = len(ids)
        progress.end("done")
        return pb.StoreStreamResponse(ids=ids)

    async def _receive(
        self,
        requests: AsyncIterator[pb.StoreStreamRequest],
        progress: WriteProgress,
        stream: StreamStore,
    ) -> tuple[PackedItems, np.ndarray]:
        limits = self._rt.config.limits
        received = PackedItems()
        chunk: list[NewMemory] = []  # the items of the chunk arriving
        count = 0
        batch = BatchEmbedding(self._rt.embeddings, limits.max_stream_batch, progress.embedded_more)
        # Each full chunk's texts are read (type, entities, valence) and the chunk packed
        # on a store thread while the model embeds and later items arrive: less is left
        # for the store, and the items are not held as objects (see PackedItems). Read
        # and embedded, the chunk goes on to be built into the batch (see StreamStore).
        read_ahead: list[asyncio.Future[bytes]] = []
        try:
            async for request in requests:
                if count >= limits.max_stream_items:
                    raise InvalidArgumentError(
                        f"StoreStream: more than {limits.max_stream_items} items in one stream"
                    )
                try:
                    item = self._rt.validator.store(request.store)
                except InvalidArgumentError as error:
                    raise InvalidArgumentError(f"item {count}: {error.message}") from None
                if not count:
                    token = progress_token(request.progress_token)
                    self._progress.track(item.channel, token, progress)
                chunk.append(item)
                count += 1
                progress.received += 1
                batch.add([item.text])
                if len(chunk) == limits.max_stream_batch:
                    read_ahead.append(asyncio.ensure_future(self._rt.run(_read_packed, chunk)))
                    stream.chunk(read_ahead[-1], batch.sent[-1], len(chunk))
                    chunk = []
            if not count:
                raise InvalidArgumentError("StoreStream: the stream held no items")
            progress.total, progress.phase = count, "embedding"
            vectors = await batch.vectors()
            for reading in read_ahead:
                received.add(await reading, limits.max_stream_batch)
            received.add(PackedItems.pack(chunk), len(chunk))  # read when stored
            return received, vectors
        finally:
            batch.cancel()
            for reading in read_ahead:
                reading.cancel()

    @rpc_errors
    async def Recall(self, request: pb.RecallRequest, context: _Context) -> pb.RecallResponse:
        with stage("validation"):
            query = self._rt.validator.recall(request)
        vector = self._asked_vector(context)
        if vector is None:
            vector = await self._rt.embeddings.query(query.query)
        inflight = self._rt.inflight + 1  # counting this call
        policy_of = self._rt.engine.channels.policy
        foreign = [  # cluster mode: the hits of named channels other shards hold
            foreign_hit(hit, policy_of)
            for answer in GATHERED.get()
            for hit in pb.RecallResponse.FromString(answer).hits
        ]
        most = self._rt.config.max_message_bytes
        result = await self._rt.run(
            self._rt.engine.recall,
            query,
            vector,
            inflight,
            foreign,
            lambda hits: hits_that_fit(hits, most),
        )
        with stage("reply"):
            reply = pb.RecallResponse(
                hits=[
                    self._hit(hit, now)
                    for hit, now in zip(result.hits, result.memories, strict=True)
                ],
                recall_id=result.recall_id,
                truncated=result.truncated,
            )
            if result.window is not None:
                reply.temporal_window.CopyFrom(window_message(result.window))
        return reply

    def _asked_vector(self, context: _Context) -> np.ndarray | None:
        """The query's embedding, when another node asked this recall with it (cluster
        mode: a recall naming channels of several shards)."""
        metadata = tuple(context.invocation_metadata() or ())
        if not any(key == FORWARDED_BY for key, _ in metadata):
            return None
        return query_vector(metadata, self._rt.embeddings.embedder.dim)

    def _hit(self, hit: Hit | ForeignHit, now: Current | None) -> pb.RecallHit:
        """A recall hit's reply: ranked here, or as another shard answered it."""
        if isinstance(hit, ForeignHit):
            return cast(pb.RecallHit, hit.reply)
        assert now is not None  # a hit of this shard has its memory as it stands
        return hit_message(hit, self._memory(now))

    @rpc_errors
    async def Inspect(self, request: pb.InspectRequest, context: _Context) -> pb.InspectResponse:
        validator = self._rt.validator
        record, edges, curve = await self._rt.run(
            self._rt.engine.inspect_with,
            validator.channel(request.channel),
            validator.memory_id(request.id),
            request.heat_curve,
        )
        reply = pb.InspectResponse(
            memory=self._memory(record),
            edges=[edge_message(e) for e in edges],
            utility_factors=utility_factor_messages(record.record, self._rt.clock.now()),
        )
        if curve is not None:
            reply.heat_curve.CopyFrom(heat_curve_message(curve))
        return reply

    @rpc_errors
    async def ListMemories(
        self, request: pb.ListMemoriesRequest, context: _Context
    ) -> pb.ListMemoriesResponse:
        """A page in id order or hottest first, cut short (``truncated``) where more
        would not fit in one answer: its page token then continues after the last
        memory it carries."""
        query = self._rt.validator.list_query(request)
        page = await self._rt.run(self._rt.engine.channels.list_page, query)
        messages = (self._memory(now) for now in page.memories)
        memories = messages_that_fit(messages, self._rt.config.max_message_bytes)
        truncated = len(memories) < len(page.memories)
        after = page.resume_after[len(memories) - 1] if truncated else page.next
        reply = pb.ListMemoriesResponse(
            memories=memories,
            next_page_token=encode_page_token(after) if after else "",
            truncated=truncated,
        )
        if query.sparklines:
            reply.heat_sparklines.extend(
                pb.HeatSparkline(heat=heats) for heats in page.sparklines[: len(memories)]
            )
            reply.sparkline_now.CopyFrom(timestamp_message(page.at))
        return reply

    @rpc_errors
    async def Update(self, request: pb.UpdateRequest, context: _Context) -> pb.UpdateResponse:
        change = self._rt.validator.update(request)
        vector = None
        if change.text is not None:
            vector = (await self._rt.embeddings.passages([change.text]))[0]
        record = await self._rt.run(self._rt.engine.edits.update, change, vector)
        return pb.UpdateResponse(memory=self._memory(record))

    @rpc_errors
    async def Keystone(self, request: pb.KeystoneRequest, context: _Context) -> pb.KeystoneResponse:
        validator = self._rt.validator
        record = await self._rt.run(
            self._rt.engine.edits.keystone,
            validator.channel(request.channel),
            validator.memory_id(request.id),
            request.keystone,
        )
        return pb.KeystoneResponse(memory=self._memory(record))

    @rpc_errors
    async def Boost(self, request: pb.BoostRequest, context: _Context) -> pb.BoostResponse:
        validator = self._rt.validator
        channel = validator.channel(request.channel)
        memory_id = validator.memory_id(request.id)
        delta = validator.delta(request.delta)
        record = await self._rt.run(self._rt.engine.edits.boost, channel, memory_id, delta)
        return pb.BoostResponse(memory=self._memory(record))

    @rpc_errors
    async def Forget(self, request: pb.ForgetRequest, context: _Context) -> pb.ForgetResponse:
        validator = self._rt.validator
        channel = validator.channel(request.channel)
        limit = self._rt.config.limits.max_forget_ids
        if len(request.ids) > limit:
            raise InvalidArgumentError(f"ids: more than {limit} in one call")
        ids = [validator.memory_id(i, "ids") for i in request.ids]
        if request.HasField("filter"):
            ids.extend(await self._rt.run(self._rt.engine.channels.matching, self._filter(request)))
        elif not ids:
            raise InvalidArgumentError("forget: give ids or a filter")
        count = await self._rt.run(self._rt.engine.edits.forget, channel, ids, request.reject)
        return pb.ForgetResponse(forgotten=count)

    def _filter(self, request: pb.ForgetRequest) -> ListQuery:
        validator = self._rt.validator
        spec = request.filter
        query = ListQuery(
            channel=request.channel,
            memory_types=validator.memory_types(spec.memory_types),
            states=validator.states(spec.states),
            tags=validator.tag_filter(spec.tags),
            time_to=validator.timestamp(spec.created_before, "filter.created_before")
            if spec.HasField("created_before")
            else None,
        )
        if not (query.memory_types or query.states or query.tags or query.time_to is not None):
            raise InvalidArgumentError(
                "filter: an empty filter would forget everything; name "
                "types, states, tags or created_before"
            )
        return query

    @rpc_errors
    async def Identity(self, request: pb.IdentityRequest, context: _Context) -> pb.IdentityResponse:
        channel = self._rt.validator.channel(request.channel)
        status = await self._rt.run(self._rt.engine.channels.status, channel)
        policy = self._rt.engine.channels.policy(channel)
        reply = status_message(status)
        reply.active_gates.extend(active_gates(policy))
        conflicts = await self._rt.run(self._rt.engine.channels.conflicts, channel)
        reply.conflicts.extend(
            memory_pb2.Conflict(a_id=a, b_id=b, reason=reason) for a, b, reason in conflicts
        )
        reply.settings.CopyFrom(settings_message(policy))
        tallies = await self._rt.run(self._rt.engine.feedback_by_type, channel)
        reply.feedback.extend(type_feedback(tallies))
        reply.feedback_summary = feedback_summary(tallies)
        return reply

    @rpc_errors
    async def Connect(self, request: pb.ConnectRequest, context: _Context) -> pb.ConnectResponse:
        validator = self._rt.validator
        channel = validator.channel(request.channel)
        from_id = validator.memory_id(request.from_id, "from_id")
        to_id = validator.memory_id(request.to_id, "to_id")
        weight = validator.unit(request.weight, "weight") or 1.0
        edge = await self._rt.run(self._rt.engine.edits.connect, channel, from_id, to_id, weight)
        return pb.ConnectResponse(edge=edge_message(edge))

    @rpc_errors
    async def Share(self, request: pb.ShareRequest, context: _Context) -> pb.ShareResponse:
        channel, memory_id, target = self._rt.validator.share(request)
        engine, most = self._rt.engine, self._rt.config.limits.max_text_bytes
        gathered = GATHERED.get()
        if gathered:  # cluster mode: the memory is another shard's, as its owner answered
            memory = shared_source(pb.InspectResponse.FromString(gathered[0]).memory)
            # The model gives its text the embedding its own shard stored with it.
            [vector] = await self._rt.embeddings.passages([memory.text])
            item = shared_copy(memory, target)
            stored = await self._rt.run(engine.store_shared, item, vector, most)
        else:
            stored = await self._rt.run(engine.share, channel, memory_id, target, most)
        return pb.ShareResponse(memory=self._memory(stored))

    @rpc_errors
    async def Evaluate(self, request: pb.EvaluateRequest, context: _Context) -> pb.EvaluateResponse:
        channel, text = self._rt.validator.evaluate(request)
        [vector] = await self._rt.embeddings.passages([text])  # compared like a memory
        evaluation = await self._rt.run(self._rt.engine.evaluate, channel, text, vector)
        stored: list[Stored] = []
        if request.store_findings and evaluation.findings:
            stored = await self._store(evaluation.findings)
        return evaluation_message(evaluation, [s.record.id for s in stored])

    @rpc_errors
    async def Tune(self, request: pb.TuneRequest, context: _Context) -> pb.TuneResponse:
        channel = self._rt.validator.channel(request.channel)
        report = await self._rt.run(self._rt.engine.tune, channel, request.dry_run)
        return tune_message(report)

    @rpc_errors
    async def DropChannel(
        self, request: pb.DropChannelRequest, context: _Context
    ) -> pb.DropChannelResponse:
        """The whole channel goes, in one batch; a channel that holds nothing answers
        ``dropped=0`` (so a retry is harmless)."""
        channel = self._rt.validator.channel(request.channel)
        dropped = await self._rt.run(self._rt.engine.drop_channel, channel)
        return pb.DropChannelResponse(dropped=dropped)

    @rpc_errors
    async def EntityCard(
        self, request: pb.EntityCardRequest, context: _Context
    ) -> pb.EntityCardResponse:
        validator = self._rt.validator
        channel = validator.channel(request.channel)
        entity = validator.entity(request.entity)
        card, memories = await self._rt.run(self._rt.engine.entity_card, channel, entity)
        return card_message(card, [self._memory(now) for now in memories])

    @rpc_errors
    async def Dream(self, request: pb.DreamRequest, context: _Context) -> pb.DreamResponse:
        channel = self._rt.validator.channel(request.channel)
        progress = WriteProgress(phase="waiting", steps=len(DREAM_STEPS))
        self._progress.track(channel, progress_token(request.progress_token), progress)
        try:
            report = await self._rt.run(self._rt.engine.dream, channel, False, progress.begin)
        except BaseException:
            progress.end("failed")
            raise
        progress.end("done")
        return dream_message(report)

    @rpc_errors
    async def Offer(self, request: pb.OfferRequest, context: _Context) -> pb.OfferResponse:
        channel = self._rt.validator.channel(request.channel)
        limit = self._rt.config.limits.max_text_bytes * 32
        if len(request.entropy) > limit:
            raise InvalidArgumentError(f"entropy: more than {limit} bytes in one offer")
        accumulated, report = await self._rt.run(
            self._rt.engine.offer, channel, len(request.entropy)
        )
        reply = pb.OfferResponse(accumulated=accumulated, dreamed=report is not None)
        if report is not None:
            reply.report.CopyFrom(dream_message(report))
        return reply

    @rpc_errors
    async def Context(self, request: pb.ContextRequest, context: _Context) -> pb.ContextResponse:
        """A block reused from the window (or a channel's empty block) answers without
        the model; otherwise the message is embedded and the block built."""
        query = self._rt.validator.context(request)
        engine, count_tokens = self._rt.engine, self._rt.embeddings.embedder.count_tokens
        inflight = self._rt.inflight + 1  # counting this call
        result = await self._rt.run(engine.context, query, None, count_tokens, inflight)
        if result is None:
            vector = await self._rt.embeddings.query(query.message)
            result = await self._rt.run(engine.context, query, vector, count_tokens, inflight)
        assert result is not None  # with the message's embedding, a block is always built
        return context_message(result)

    @rpc_errors
    async def Feedback(self, request: pb.FeedbackRequest, context: _Context) -> pb.FeedbackResponse:
        channel, recall_id, rating, memory_ids = self._rt.validator.feedback(request)
        tallies = await self._rt.run(
            self._rt.engine.feedback, channel, recall_id, rating, memory_ids
        )
        return feedback_message(tallies)

    async def Export(
        self, request: pb.ExportRequest, context: _Context
    ) -> AsyncIterator[pb.ExportResponse]:
        """The channel as Markdown: a header, then sections in id order, a page at a time,
        each memory with its whole state and its edges to the others exported."""
        try:
            channel = self._rt.validator.channel(request.channel)
            transfer = self._rt.engine.transfer
            ids = await self._rt.run(transfer.export_ids, channel, request.include_archived)
            header = render_header(channel, self._rt.clock.now(), len(ids))
            yield pb.ExportResponse(markdown=header, memories=0)
            within = frozenset(ids)
            for start in range(0, len(ids), _EXPORT_PAGE):
                chunk = ids[start : start + _EXPORT_PAGE]
                page = await self._rt.run(transfer.export_page, channel, chunk, within)
                sections = [
                    render_memory(
                        m.current.record,
                        m.current.heat,
                        m.current.record.state,
                        edges=m.edges,
                        interactions=m.interactions,
                    )
                    for m in page
                ]
                if sections:
                    yield pb.ExportResponse(markdown="".join(sections), memories=len(sections))
        except CalorError as error:
            await abort_with(context, error)

    async def Import(
        self, request_iterator: AsyncIterator[pb.ImportRequest], context: _Context
    ) -> pb.ImportResponse:
        """Markdown (an export, or a plain list of notes) in as memories, all or nothing:
        parsed and embedded as it arrives, imported together in one batch."""
        progress = WriteProgress()
        limits = self._rt.config.limits
        batch = BatchEmbedding(self._rt.embeddings, limits.max_stream_batch, progress.embedded_more)
        try:
            channel, parsed, remap_ids = await self._read_import(request_iterator, batch, progress)
            progress.total, progress.phase = len(parsed), "embedding"
            vectors = await batch.vectors()
            progress.phase = "storing"
            ids = await self._rt.run(
                self._rt.engine.transfer.import_memories, channel, parsed, vectors, remap_ids
            )
        except CalorError as error:
            progress.end("failed")
            await abort_with(context, error)
            raise  # unreachable: abort raises
        finally:
            batch.cancel()
        progress.stored = len(ids)
        progress.end("done")
        return pb.ImportResponse(ids=ids)

    async def _read_import(
        self,
        requests: AsyncIterator[pb.ImportRequest],
        batch: BatchEmbedding,
        progress: WriteProgress,
    ) -> tuple[str, list[ParsedMemory], bool]:
        """The import's channel, memories and whether to remap their ids; each memory is
        checked against the limits and handed to ``batch`` to embed as it is read."""
        validator = self._rt.validator
        reader = MarkdownReader()
        channel = ""
        remap_ids = False
        parsed: list[ParsedMemory] = []

        def take(read: list[ParsedMemory]) -> None:
            for p in read:
                validator.imported(to_new_memory(p, channel), p.line, p.state)
            parsed.extend(read)
            self._cap_import(parsed)
            batch.add([p.text for p in read])
            progress.received = len(parsed)

        async for request in requests:
            if request.channel and request.channel != channel:
                if channel:
                    raise InvalidArgumentError("channel: one import goes to one channel")
                channel = validator.channel(request.channel)
                self._progress.track(channel, progress_token(request.progress_token), progress)
            if not channel:
                raise InvalidArgumentError("channel: the first message must name the channel")
            remap_ids = remap_ids or request.remap_ids
            take(reader.feed(request.markdown))
        take(reader.finish())
        if not parsed:
            raise InvalidArgumentError(
                "Import: the Markdown held no memories (each note is a bullet line, '- …', "
                "or a '## ' section of an export; paragraphs are not read as memories)"
            )
        return channel, parsed, remap_ids

    @rpc_errors
    async def Progress(self, request: pb.ProgressRequest, context: _Context) -> pb.ProgressResponse:
        channel = self._rt.validator.channel(request.channel)
        token = progress_token(request.progress_token)
        if not token:
            raise InvalidArgumentError("progress_token: name the token the write was given")
        return _progress_message(self._progress.read(channel, token))

    @rpc_errors
    async def ListChannels(
        self, request: pb.ListChannelsRequest, context: _Context
    ) -> pb.ListChannelsResponse:
        """A page of the readable channels' names after the token's, in name order."""
        validator = self._rt.validator
        limits = self._rt.config.limits
        size = validator.limit(
            request.page_size, "page_size", limits.default_page_size, limits.max_page_size
        )
        if len(request.prefix) > limits.max_channel_chars:
            raise InvalidArgumentError(f"prefix: over {limits.max_channel_chars} characters")
        after = decode_page_token(request.page_token, valid=validator.is_channel)
        readable = caller.grants().predicate(Permission.READ)
        names = await self._rt.run(self._rt.engine.channels.names)
        shown = [
            name
            for name in names
            if name > after and name.startswith(request.prefix) and readable(name)
        ]
        page = shown[:size]
        more = len(shown) > size
        return pb.ListChannelsResponse(
            channels=page, next_page_token=encode_page_token(page[-1]) if more else ""
        )

    def _cap_import(self, items: list[ParsedMemory]) -> None:
        """Refuse an import past the cap on items per call (StoreStream's cap)."""
        cap = self._rt.config.limits.max_stream_items
        if len(items) > cap:
            raise InvalidArgumentError(f"Import: more than {cap} memories in one import")


def _progress_message(progress: WriteProgress) -> pb.ProgressResponse:
    return pb.ProgressResponse(
        received=progress.received,
        embedded=progress.embedded,
        stored=progress.stored,
        total=progress.total,
        phase=progress.phase,
        step=progress.step,
        steps=progress.steps,
    )


def _read_packed(items: list[NewMemory]) -> bytes:
    """The items with their texts read (``NewMemory.read``), packed (see
    :class:`PackedItems`)."""
    return PackedItems.pack([item.read() for item in items])

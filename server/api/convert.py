"""Engine records → API messages; heat and state are evaluated at the moment of reply."""

from __future__ import annotations

from collections.abc import Callable

from calor.server.api.wire import Enum, enum_name, full_name, timestamp_message
from calor.server.engine.cards import EntityCard
from calor.server.engine.context import ContextResult
from calor.server.engine.dream_report import DreamReport
from calor.server.engine.evaluate import Evaluation
from calor.server.engine.feedback import TypeTally, hint
from calor.server.engine.recall_log import ForeignHit, logged_hit
from calor.server.engine.results import ChannelStatus
from calor.server.engine.share import SharedSource
from calor.server.engine.tuning import FITTED, TuneReport
from calor.server.errors import NotFoundError
from calor.server.recall.ranking import Hit
from calor.server.recall.temporal import TimeWindow
from calor.server.records import MemoryRecord
from calor.server.thermo.curve import HeatCurve
from calor.server.thermo.graph import Edge
from calor.server.thermo.lifecycle import utility_evidence
from calor.server.thermo.policy import ChannelPolicy
from calor.server.thermo.utility import UtilityWeights
from calor.v1 import memory_pb2, memory_service_pb2

__all__ = [
    "card_message",
    "context_message",
    "dream_message",
    "edge_message",
    "feedback_message",
    "evaluation_message",
    "foreign_hit",
    "heat_curve_message",
    "hit_message",
    "memory_message",
    "shared_source",
    "status_message",
    "tune_message",
    "type_feedback",
    "utility_factor_messages",
    "window_message",
]


def memory_message(record: MemoryRecord, heat: float, readable: bool = True) -> memory_pb2.Memory:
    """The API view of a memory as it stands now (evolved), with its current heat; not
    ``readable`` (the caller may write its channel but not read it), without what it
    says: no text, tags, entities or provenance, and ``content_withheld`` set."""
    if not readable:
        message = memory_message(record, heat)
        for name in ("text", "tags", "entities", "provenance"):  # what the memory says
            message.ClearField(name)
        message.content_withheld = True
        return message
    message = memory_pb2.Memory(
        id=record.id,
        channel=record.channel,
        text=record.text,
        memory_type=memory_pb2.MemoryType.Value(full_name("MEMORY_TYPE_", record.memory_type)),
        heat=heat,
        stability=record.stability,
        importance=record.importance,
        utility=record.utility,
        recall_count=record.recall_count,
        keystone=record.keystone,
        state=memory_pb2.MemoryState.Value(full_name("MEMORY_STATE_", record.state)),
        tags=record.tags,
        entities=record.entities,
        created_at=timestamp_message(record.created_at),
        updated_at=timestamp_message(record.updated_at),
        merged_into=record.merged_into,
        merged_from=record.merged_from,
        source=memory_pb2.Source.Value(full_name("SOURCE_", record.source)),
        confidence=memory_pb2.Confidence.Value(full_name("CONFIDENCE_", record.confidence)),
        provenance=record.provenance,
        heat0=record.heat0,
        t0=timestamp_message(record.t0),
        surprise=record.surprise,
        importance_adjustment=record.importance_adjustment,
        classifier_version=record.classifier_version,
    )
    if record.last_recalled_at is not None:
        message.last_recalled_at.CopyFrom(timestamp_message(record.last_recalled_at))
    return message


def utility_factor_messages(
    record: MemoryRecord, now: float
) -> list[memory_service_pb2.UtilityFactor]:
    """What a memory's utility is made of as of ``now``, each factor with its weight."""
    weights = UtilityWeights()
    return [
        memory_service_pb2.UtilityFactor(
            name=name, score=score, weight=getattr(weights, name) / weights.total
        )
        for name, score in utility_evidence(record, now).items()
    ]


def edge_message(edge: Edge) -> memory_pb2.Edge:
    """One graph edge."""
    return memory_pb2.Edge(
        from_id=edge.from_id,
        to_id=edge.to_id,
        kind=memory_pb2.EdgeKind.Value(full_name("EDGE_KIND_", edge.kind)),
        weight=edge.weight,
    )


def hit_message(hit: Hit, memory: memory_pb2.Memory) -> memory_service_pb2.RecallHit:
    """One recall hit with its score breakdown."""
    return memory_service_pb2.RecallHit(
        memory=memory,
        score=hit.score,
        similarity=hit.similarity,
        keyword=hit.keyword,
        temporal=hit.temporal,
        band=hit.band,
        heat=hit.heat,
        channel_bonus=hit.channel_bonus,
        lexical=hit.lexical,
        source=hit.source,
        lexical_weight=hit.lexical_weight,
        spread=hit.spread,
        relevance=hit.relevance,
    )


def foreign_hit(
    message: memory_service_pb2.RecallHit, policy_of: Callable[[str], ChannelPolicy]
) -> ForeignHit:
    """A hit another shard ranked and answered (``message``), to be ranked and logged
    among this shard's; ``policy_of`` names the weights its channel ranked with."""
    memory = message.memory
    memory_type = _engine_name(memory_pb2.MemoryType, "MEMORY_TYPE_", memory.memory_type)
    weights = policy_of(memory.channel).weights
    return ForeignHit(logged_hit(message, memory.id, memory_type, False, weights), message)


def shared_source(memory: memory_pb2.Memory) -> SharedSource:
    """What a share copies of a memory another shard answered (``Inspect``).

    Raises:
        NotFoundError: The memory was forgotten.
    """
    if memory.state == memory_pb2.MEMORY_STATE_DELETED:
        raise NotFoundError(f"memory {memory.id} was forgotten")
    return SharedSource(
        channel=memory.channel,
        id=memory.id,
        text=memory.text,
        memory_type=_engine_name(memory_pb2.MemoryType, "MEMORY_TYPE_", memory.memory_type),
        tags=dict(memory.tags),
        source=_engine_name(memory_pb2.Source, "SOURCE_", memory.source),
        confidence=_engine_name(memory_pb2.Confidence, "CONFIDENCE_", memory.confidence),
    )


def _engine_name(enum: Enum, prefix: str, number: int) -> str:
    """The engine name of a number another node answered with ("unspecified" for one
    this release does not know)."""
    return enum_name(enum, prefix, number) or "unspecified"


def evaluation_message(
    evaluation: Evaluation, stored_ids: list[str]
) -> memory_service_pb2.EvaluateResponse:
    """An evaluation: its status and alignment (``score`` too), each issue with its
    correction, and the ids of the stored findings."""
    return memory_service_pb2.EvaluateResponse(
        alignment=evaluation.alignment,
        status=evaluation.status,
        score=evaluation.alignment,
        issues=[
            memory_service_pb2.EvaluationIssue(
                kind=issue.kind,
                memory_id=issue.memory_id,
                message=issue.message,
                similarity=issue.similarity,
                correction=issue.correction,
            )
            for issue in evaluation.issues
        ],
        stored_ids=stored_ids,
    )


def context_message(result: ContextResult) -> memory_service_pb2.ContextResponse:
    """A Context block, with each memory it shows as it stands now."""
    return memory_service_pb2.ContextResponse(
        block=result.block,
        tokens_used=result.tokens_used,
        items=[
            memory_service_pb2.ContextItem(
                memory=memory_message(now.record, now.heat),
                signal=item.signal,
                score=item.hit.score,
                band=item.hit.band,
            )
            for item, now in zip(result.items, result.memories, strict=True)
        ],
        recall_id=result.recall_id,
        reused=result.reused,
    )


def card_message(
    card: EntityCard, memories: list[memory_pb2.Memory]
) -> memory_service_pb2.EntityCardResponse:
    """An entity card: the entity as the memories spell it, its memories, its text."""
    return memory_service_pb2.EntityCardResponse(
        entity=card.entity, memories=memories, card=card.text
    )


def window_message(window: TimeWindow) -> memory_service_pb2.TimeWindow:
    """The time window a recall boosted."""
    return memory_service_pb2.TimeWindow(
        start=timestamp_message(window.start.timestamp()),
        end=timestamp_message(window.end.timestamp()),
        phrase=window.phrase,
    )


_STEP_CAUSES = {
    "recall": memory_service_pb2.HEAT_STEP_CAUSE_RECALL,
    "boost": memory_service_pb2.HEAT_STEP_CAUSE_BOOST,
    "resonance": memory_service_pb2.HEAT_STEP_CAUSE_RESONANCE,
    "warmed": memory_service_pb2.HEAT_STEP_CAUSE_RESONANCE,
    "settled": memory_service_pb2.HEAT_STEP_CAUSE_SETTLED,
    "cooled": memory_service_pb2.HEAT_STEP_CAUSE_COOLED,
}


def heat_curve_message(curve: HeatCurve) -> memory_service_pb2.HeatCurve:
    """A memory's heat curve (``Inspect`` with ``heat_curve``)."""
    message = memory_service_pb2.HeatCurve(
        past=[_heat_point(at, heat) for at, heat in curve.past],
        projected=[_heat_point(at, heat) for at, heat in curve.projected],
        steps=[
            memory_service_pb2.HeatStep(
                at=timestamp_message(step.at),
                before=step.before,
                after=step.after,
                cause=_STEP_CAUSES.get(step.cause, memory_service_pb2.HEAT_STEP_CAUSE_UNSPECIFIED),
            )
            for step in curve.steps
        ],
        floor=curve.floor,
        cold_threshold=curve.cold_threshold,
        now=timestamp_message(curve.now),
    )
    for field, moment in (
        ("floor_at", curve.floor_at),
        ("cold_at", curve.cold_at),
        ("migration_at", curve.migration_at),
    ):
        if moment is not None:
            getattr(message, field).CopyFrom(timestamp_message(moment))
    return message


def _heat_point(at: float, heat: float) -> memory_service_pb2.HeatPoint:
    return memory_service_pb2.HeatPoint(at=timestamp_message(at), heat=heat)


def dream_message(report: DreamReport) -> memory_service_pb2.DreamResponse:
    """The dream report."""
    return memory_service_pb2.DreamResponse(**report.__dict__)


def status_message(status: ChannelStatus) -> memory_service_pb2.IdentityResponse:
    """A channel's counts, keyed by the API's enum names."""
    return memory_service_pb2.IdentityResponse(
        total=status.total,
        by_state={full_name("MEMORY_STATE_", k): v for k, v in status.by_state.items()},
        by_type={full_name("MEMORY_TYPE_", k): v for k, v in status.by_type.items()},
        channel_heat=status.channel_heat,
        consolidation_sweeps=status.sweeps,
        interactions=status.interactions,
        hottest=[memory_message(hot.record, hot.heat) for hot in status.hottest],
        recent_dreams=[_dream_record(counts) for counts in status.recent_dreams],
        heat_histograms=[
            memory_service_pb2.HeatHistogram(memory_type=_type_number(name), counts=counts)
            for name, counts in sorted(status.heat_histograms.items())
        ],
    )


def _dream_record(counts: dict[str, float]) -> memory_service_pb2.DreamRecord:
    report = memory_service_pb2.DreamResponse()
    fields = report.DESCRIPTOR.fields_by_name
    for name, value in counts.items():
        field = fields.get(name)
        if field is None:
            continue  # when and which: the record's own fields
        setattr(report, name, value if field.cpp_type == field.CPPTYPE_DOUBLE else int(value))
    return memory_service_pb2.DreamRecord(
        at=timestamp_message(counts.get("at", 0.0)), sweep=bool(counts.get("sweep")), report=report
    )


def _type_number(name: str) -> memory_pb2.MemoryType.ValueType:
    return memory_pb2.MemoryType.Value(full_name("MEMORY_TYPE_", name))


def feedback_message(tallies: dict[str, TypeTally]) -> memory_service_pb2.FeedbackResponse:
    """A channel's feedback counts per rated memory type, keyed by the MemoryType enum's
    names (every rated type in each map, 0 included)."""

    def by_type(rating: str) -> dict[str, int]:
        return {full_name("MEMORY_TYPE_", name): t.count(rating) for name, t in tallies.items()}

    return memory_service_pb2.FeedbackResponse(
        helpful_by_type=by_type("helpful"),
        unhelpful_by_type=by_type("unhelpful"),
        partial_by_type=by_type("partial"),
    )


def type_feedback(tallies: dict[str, TypeTally]) -> list[memory_service_pb2.TypeFeedback]:
    """Each rated memory type's counts, helpful share and hint, in the enum's order."""
    return sorted(
        (
            memory_service_pb2.TypeFeedback(
                memory_type=_type_number(name),
                helpful=tally.helpful,
                unhelpful=tally.unhelpful,
                partial=tally.partial,
                helpful_share=tally.helpful_share,
                hint=hint(name, tally),
            )
            for name, tally in tallies.items()
        ),
        key=lambda message: message.memory_type,
    )


def tune_message(report: TuneReport) -> memory_service_pb2.TuneResponse:
    """A fit's report; the weights by their ChannelSettings names (``weight_keyword``, ...)."""
    names = ("similarity", *FITTED)
    return memory_service_pb2.TuneResponse(
        fitted=report.fitted,
        held_back=report.held_back,
        held_back_before=report.held_back_before,
        held_back_after=report.held_back_after,
        applied=report.applied,
        before={f"weight_{name}": getattr(report.before, name) for name in names},
        after={f"weight_{name}": getattr(report.after, name) for name in names},
        explanation=report.explanation,
    )

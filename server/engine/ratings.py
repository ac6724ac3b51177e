"""Feedback on a channel's recalls, and the weights fitted to it: the engine's side of
``Feedback``, the per-type report in ``Identity``, and ``Tune``.

Feedback is written with the one write path, under the channel's lock (the recall log's
retention runs under it too); fitted weights are applied through the channel's settings.
Reads on a channel that does not exist write nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from calor.server.clock import Clock
from calor.server.engine.changes import changing
from calor.server.engine.feedback import (
    TypeTally,
    feedback_entry,
    recent_feedback,
    tally_by_type,
)
from calor.server.engine.recall_log import RecallLog
from calor.server.engine.registry import ChannelRegistry
from calor.server.engine.tuning import MIN_RECALLS, Rated, TuneReport, fit, rated
from calor.server.errors import FailedPreconditionError, NotFoundError
from calor.server.storage.store import MemoryStore

__all__ = ["Ratings"]


class Ratings:
    """Every channel's feedback on its recalls, and the fit of its recall weights."""

    def __init__(
        self, store: MemoryStore, clock: Clock, channels: ChannelRegistry, log: RecallLog
    ) -> None:
        self._store = store
        self._clock = clock
        self._channels = channels
        self._log = log

    def give(
        self, channel: str, recall_id: str, rating: str, memory_ids: Sequence[str]
    ) -> dict[str, TypeTally]:
        """Rate a logged recall (replacing earlier feedback on it); the channel's tallies
        by memory type over the last 30 days, this rating included.

        Raises:
            NotFoundError: The channel logged no recall with that id (or dropped it).
            InvalidArgumentError: A named memory is not a hit of the recall.
        """
        live = self._channels.find(channel)
        missing = NotFoundError(f"no recall {recall_id} in channel {channel!r}")
        if live is None:
            raise missing
        with live.lock:
            recall = self._log.entry(channel, recall_id)
            if recall is None:
                raise missing
            now = self._clock.now()
            entry = feedback_entry(recall, rating, memory_ids, now)
            with changing(self._store, live) as change:
                change.keep([entry.put(channel)])
            return tally_by_type(recent_feedback(self._store, channel, now))

    def by_type(self, channel: str) -> dict[str, TypeTally]:
        """A channel's feedback tallies by memory type over the last 30 days."""
        if self._channels.find(channel) is None:
            return {}
        return tally_by_type(recent_feedback(self._store, channel, self._clock.now()))

    def tune(self, channel: str, dry_run: bool) -> TuneReport:
        """Fit a channel's recall weights to its feedback of the last 30 days; apply them
        (unless ``dry_run``) when they agree better with the held-back feedback.

        Raises:
            FailedPreconditionError: Fewer than 20 recalls with feedback.
        """
        live = self._channels.find(channel)
        recalls = self._rated(channel) if live is not None else []
        if live is None or len(recalls) < MIN_RECALLS:
            raise FailedPreconditionError(
                f"channel {channel!r} has {len(recalls)} recalls with feedback in the last 30 "
                f"days; tune needs at least {MIN_RECALLS}"
            )
        report = fit(live.policy.weights, recalls)
        if not report.better:
            return replace(report, explanation=f"{report.explanation} Not applied.")
        if dry_run:
            return replace(report, explanation=f"{report.explanation} Not applied: a dry run.")
        with live.lock:
            policy = live.policy
            self._channels.set_policy(channel, replace(policy, weights=report.after))
        return replace(report, applied=True, explanation=f"{report.explanation} Applied.")

    def _rated(self, channel: str) -> list[Rated]:
        """The channel's recalls with feedback of the last 30 days, in id order."""
        found: list[Rated] = []
        for feedback in recent_feedback(self._store, channel, self._clock.now()):
            recall = self._log.entry(channel, feedback.recall_id)
            if recall is not None:
                found.append(rated(recall, feedback))
        return found

"""The synchronous client's SettingsService and TriggerService calls (settings, server
status; triggers, their dry runs and history, the event stream): ``CalorClient`` draws
on them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Unpack

from calor.client import _convert_settings, _convert_triggers, _enums
from calor.client._convert import ClientBase
from calor.client._convert_triggers import TriggerOptions
from calor.client._enums import EnumArg
from calor.client._subscription import Backoff, EventStream, Resumer
from calor.client.errors import translate_rpc_errors
from calor.v1 import (
    memory_pb2,
    settings_service_pb2,
    settings_service_pb2_grpc,
    trigger_service_pb2,
    trigger_service_pb2_grpc,
)

__all__ = ["SettingsCalls", "TriggerCalls"]


class SettingsCalls(ClientBase):
    """The SettingsService methods of :class:`~calor.client.CalorClient`."""

    _settings: settings_service_pb2_grpc.SettingsServiceStub

    def get_settings(self, *, channel: str | None = None) -> memory_pb2.ChannelSettings:
        """The settings in force in a channel: its profiles, decay mode, gates, thresholds
        and weights (the defaults, for a channel never changed)."""
        request = settings_service_pb2.GetSettingsRequest(channel=self._in(channel))
        with translate_rpc_errors():
            return self._settings.GetSettings(request, timeout=self.timeout).settings

    def update_settings(
        self, *, channel: str | None = None, **fields: object
    ) -> memory_pb2.ChannelSettings:
        """Change the settings named, and only those; the channel's next call uses them.

        Example::

            calor.update_settings(decay_mode="hybrid", cold_threshold=0.2)

        Args:
            channel: The channel, instead of the client's.
            **fields: ``ChannelSettings`` fields and their new values. Enums take
                names (``decay_mode="hybrid"``, ``dream_archive_exempt_types=["core"]``);
                ``profiles`` takes ``TypeProfile`` messages or mappings with every field
                (``{"memory_type": "fact", "half_life_seconds": 3600.0, "floor": 0.1,
                "stability_gain": 2.0}``), each replacing the profile of its type.

        Returns:
            The settings now in force.

        Raises:
            TypeError: A name is not a ``ChannelSettings`` field.
            InvalidArgumentError: No field is given, or a value is out of range (the
                message names the field); nothing changes.
        """
        request = _convert_settings.settings_request(self._in(channel), fields)
        with translate_rpc_errors():
            return self._settings.UpdateSettings(request, timeout=self.timeout).settings

    def status(self) -> settings_service_pb2.ServerStatusResponse:
        """How the whole server is doing, for operators (a channel's own counts are
        :meth:`identity`'s).

        Returns:
            Its version, model and uptime; channels, memories per state over every
            channel, the last event number and open subscribers; its data directory's
            size and resident memory; whether it asks for API keys and speaks TLS.

        Raises:
            PermissionDeniedError: The key has no ``admin`` grant (under access control).
        """
        request = settings_service_pb2.ServerStatusRequest()
        with translate_rpc_errors():
            return self._settings.ServerStatus(request, timeout=self.timeout)


class TriggerCalls(ClientBase):
    """The TriggerService methods of :class:`~calor.client.CalorClient`."""

    _triggers: trigger_service_pb2_grpc.TriggerServiceStub

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

    def trigger_history(
        self, trigger_id: str, *, latest: int = 0
    ) -> list[trigger_service_pb2.TriggerFiring]:
        """Every firing of a trigger, oldest first: when, on which memory, with what
        outcome; or, with ``latest``, only that many of the newest, newest first."""
        request = trigger_service_pb2.TriggerHistoryRequest(trigger_id=trigger_id)
        if latest:
            request.page_size, request.newest_first = latest, True
            with translate_rpc_errors():
                page = self._triggers.TriggerHistory(request, timeout=self.timeout)
            return list(page.firings)
        firings: list[trigger_service_pb2.TriggerFiring] = []
        while True:
            with translate_rpc_errors():
                page = self._triggers.TriggerHistory(request, timeout=self.timeout)
            firings.extend(page.firings)
            if not page.next_page_token:
                return firings
            request.page_token = page.next_page_token

    def trigger_feedback(
        self, trigger_id: str, cause_seq: int, rating: EnumArg, *, channel: str | None = None
    ) -> trigger_service_pb2.Trigger:
        """Rate one firing of a trigger ``useful`` or ``noise``; the trigger as it stands
        after, with its precision over the last 30 days (``flagged`` when it is under the
        channel's ``trigger_min_precision`` over 20 rated firings; ``paused`` says why
        when the channel's ``trigger_auto_pause`` paused it).

        Args:
            trigger_id: The trigger.
            cause_seq: The seq of the event that made it fire (a firing's ``seq``).
            rating: ``"useful"`` or ``"noise"``.
            channel: The trigger's channel, instead of the client's.

        Raises:
            NotFoundError: No such trigger, or it did not fire for that event.
        """
        request = _convert_triggers.feedback_request(
            self._in(channel), trigger_id, cause_seq, rating
        )
        with translate_rpc_errors():
            return self._triggers.TriggerFeedback(request, timeout=self.timeout).trigger

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
        channels: Iterable[str] | None = None,
        kinds: Iterable[EnumArg] = (),
        trigger_ids: Iterable[str] = (),
        after_seq: int | None = None,
        resume: bool = True,
        from_oldest_retained: bool = False,
        backoff: Backoff | None = None,
        until_seq: int = 0,
    ) -> EventStream:
        """Stream the client's channel's events from now on, as they are logged.

        Returns once the server has opened the stream: every event logged after that
        is delivered. Each event comes once, in sequence order. By default the stream holds the
        client's own channel and starts now; ``after_seq`` starts it after an earlier
        event instead (0: from the oldest the log still holds), and ``channels`` names
        others (an empty list: every channel the caller may read). A filter left empty
        matches everything. The stream has no deadline.

        When the server ends the stream because the caller fell behind
        (RESOURCE_EXHAUSTED) or it is going away or cannot be reached
        (UNAVAILABLE, or CANCELLED by a server that stopped), the stream resubscribes
        by itself after the last event it yielded (or where it started), so nothing is
        lost or repeated. By default it keeps trying for as long as the outage lasts,
        waiting 0.2 s doubling up to 10 s (less a random share of up to half) between
        attempts; pass ``backoff`` to change that or to give up after a number of
        failures in a row. Iterating blocks; close the stream (from any thread) or
        leave its ``with`` block to cancel the call.

        Example::

            with calor.subscribe(kinds=["notify"]) as events:
                for event in events:
                    print(event.seq, event.message)

        Args:
            channels: Only events of these channels; None (the default) is the
                client's own, ``[]`` every channel the caller may read.
            kinds: Only these kinds: ``"on_store"``, ``"notify"``, ``"dream"``, …
            trigger_ids: Only events caused by these triggers.
            after_seq: Start after this sequence number (0: the oldest event kept);
                None (the default): from now on.
            resume: Resubscribe after RESOURCE_EXHAUSTED, UNAVAILABLE and a server's
                CANCELLED; with False
                those are raised like any other error.
            from_oldest_retained: Start from the oldest event kept: when ``after_seq``
                is None, or when retention dropped events after it (instead of raising
                :class:`~calor.client.errors.OutOfRangeError`).
            backoff: How to wait between resubscriptions and how many failures in a
                row to allow (:class:`~calor.client.Backoff`); None: the default,
                which retries for ever.
            until_seq: End the stream once every event up to this sequence was
                delivered (with ``after_seq``, a window of history; at most the log's
                last sequence); 0 (the default): no end.

        Returns:
            An iterator of ``Event`` messages; its ``last_seq`` is the resume point.

        Raises:
            InvalidArgumentError: An unknown kind or a negative ``after_seq`` (at
                once); a channel the server rejects (when iterating).
            OutOfRangeError: When iterating: ``after_seq`` (or the resume point after
                an outage) is past the end of the server's log, or retention dropped
                events after it; ``last_seq`` or ``oldest_seq`` names the bound.
        """
        request = _convert_triggers.subscribe_request(
            self.channel, channels, kinds, trigger_ids, after_seq, from_oldest_retained
        )
        request.until_seq = until_seq
        stream = EventStream(
            lambda req: self._triggers.Subscribe(req, timeout=None),
            Resumer(request, resume=resume, backoff=backoff),
        )
        return stream.start()  # from now: from when this returns, not the first next()

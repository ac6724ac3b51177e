"""Every RocksDB key of the store, by name: the whole on-disk schema.

Schema version 4. Keys are raw bytes; channel names never hold NUL (``\\0`` below).

    meta:schema                        JSON {schema_version, model_id, dim}
    meta:migrations                    JSON list of the migrations this store went through
    meta:last_seq                      the last event number given (kept when the log is trimmed)
    meta:purge                         JSON key ranges whose old bytes RocksDB must still drop
    m:<channel>\\0<id>                  MemoryRecord JSON
    w:<channel>\\0<id>                  its heat since resonance changed it: heat0, t0 (f64),
                                       interactions0 (i64), little-endian; over the
                                       record's until the record is written again
    v:<channel>\\0<id>                  float32 embedding, little-endian
    i:<channel>\\0<key>                 id of the memory stored under an idempotency key
    p:<channel>                        the channel's policy (settings) JSON
    c:<channel>                        the channel's own state JSON (heat, interactions, ...)
    e:<channel>\\0<a>\\0<b>\\0<kind>       edge weight as text (a < b; edges are undirected)
    x:<channel>\\0<a>\\0<b>              an open conflict's reason (a < b)
    l:<seq, 8 bytes big-endian>        EventRecord JSON: the event log, numbered at commit
    t:<channel>\\0<trigger id>         TriggerRule JSON (a trigger id is its channel's own)
    f:<channel>\\0<trigger id>         the trigger's fire counter JSON
    h:<channel>\\0<trigger id>\\0<order, 8 bytes>
                                       a firing of the trigger (its history) JSON
    d:<channel>\\0<trigger id>\\0<memory id>
                                       t0 of the heat trajectory whose decay already fired
    u:<channel>\\0<trigger id>\\0<cause seq, 8 bytes>
                                       the rating of the firing that event caused JSON
    s:cursor                           the trigger dispatcher's place in the log JSON
    s:watermark                        time up to which decay crossings were handled
    o:<idempotency key>                a webhook delivery not yet finished JSON
    r:<channel>\\0<recall id>           a recall's logged hits and their signals JSON (recall log)
    g:<channel>\\0<recall id>           the last feedback on that recall JSON
    q:<channel>                        the channel's recall log tally JSON {entries}
    k:<channel>\\0<id>\\0<key>           ``key`` quotes the memory's text: what to put there
                                       once the memory is forgotten (a quote index)
    n:<channel>\\0<id>                  a rejection: the float32 embedding of a memory
                                       forgotten with ``reject`` (its text is gone)

Keys are built here (:class:`Keys`) and nowhere else; the store's readers parse them
with :func:`split`.
"""

from __future__ import annotations

__all__ = [
    "CHANNEL_FAMILIES",
    "SCHEMA_VERSION",
    "SEP",
    "TRIGGER_FAMILIES",
    "Keys",
    "join",
    "past",
    "seq_bytes",
    "split",
]

# 3: heats beside records (w:); 4: trigger keys under their channel (ids are per channel).
# An older Calor would not read them.
SCHEMA_VERSION = 4
SEP = b"\x00"


def join(prefix: bytes, *parts: str) -> bytes:
    return prefix + SEP.join(part.encode() for part in parts)


def split(key: bytes) -> list[str]:
    return [part.decode() for part in key[2:].split(SEP)]


def seq_bytes(seq: int) -> bytes:
    return seq.to_bytes(8, "big")


class Keys:
    """Every key of the store, by name."""

    META = b"meta:schema"
    MIGRATIONS = b"meta:migrations"
    LAST_SEQ = b"meta:last_seq"
    PURGE = b"meta:purge"
    LOG_POSITION = b"meta:log_position"  # cluster mode: the last write-log entry applied
    CURSOR = b"s:cursor"
    WATERMARK = b"s:watermark"
    # Whole families, for the store's readers to scan.
    MEMORIES = b"m:"
    HEATS = b"w:"
    VECTORS = b"v:"
    IDEMPOTENCY = b"i:"
    POLICIES = b"p:"
    STATES = b"c:"
    EDGES = b"e:"
    CONFLICTS = b"x:"
    EVENTS = b"l:"
    TRIGGERS = b"t:"
    FIRE_COUNTERS = b"f:"
    HISTORY = b"h:"
    DECAY_MARKS = b"d:"
    DELIVERIES = b"o:"

    @staticmethod
    def in_channel(family: bytes, channel: str) -> bytes:
        """The prefix of one channel's keys of a family (``MEMORIES``, ``EDGES``, ...)."""
        return join(family, channel, "")

    @staticmethod
    def memory(channel: str, memory_id: str) -> bytes:
        """A memory's record."""
        return join(b"m:", channel, memory_id)

    @staticmethod
    def heat(channel: str, memory_id: str) -> bytes:
        """A memory's heat, when resonance changed it since the record was written."""
        return join(b"w:", channel, memory_id)

    @staticmethod
    def vector(channel: str, memory_id: str) -> bytes:
        """A memory's embedding."""
        return join(b"v:", channel, memory_id)

    @staticmethod
    def idempotency(channel: str, key: str) -> bytes:
        """The memory a store with this idempotency key made."""
        return join(b"i:", channel, key)

    @staticmethod
    def policy(channel: str) -> bytes:
        """A channel's settings."""
        return b"p:" + channel.encode()

    @staticmethod
    def channel_state(channel: str) -> bytes:
        """A channel's own state."""
        return b"c:" + channel.encode()

    @staticmethod
    def edge(channel: str, a: str, b: str, kind: str) -> bytes:
        """An undirected edge (the smaller id first)."""
        low, high = (a, b) if a < b else (b, a)
        return join(b"e:", channel, low, high, kind)

    @staticmethod
    def conflict(channel: str, a: str, b: str) -> bytes:
        """An open conflict between two memories (the smaller id first)."""
        low, high = (a, b) if a < b else (b, a)
        return join(b"x:", channel, low, high)

    @staticmethod
    def event(seq: int) -> bytes:
        """A logged event: sequence numbers sort as keys."""
        return b"l:" + seq_bytes(seq)

    @staticmethod
    def trigger(channel: str, trigger_id: str) -> bytes:
        """A trigger's rule (trigger ids are per channel)."""
        return join(b"t:", channel, trigger_id)

    @staticmethod
    def fire_counter(channel: str, trigger_id: str) -> bytes:
        """How often a trigger fired, and when last."""
        return join(b"f:", channel, trigger_id)

    @staticmethod
    def firing(channel: str, trigger_id: str, order: int) -> bytes:
        """One entry of a trigger's history."""
        return Keys.history(channel, trigger_id) + seq_bytes(order)

    @staticmethod
    def trigger_ratings(channel: str, trigger_id: str) -> bytes:
        """The prefix of a trigger's ratings (TriggerFeedback)."""
        return join(b"u:", channel, trigger_id, "")

    @staticmethod
    def trigger_rating(channel: str, trigger_id: str, cause_seq: int) -> bytes:
        """The rating of the firing an event (its seq) caused."""
        return Keys.trigger_ratings(channel, trigger_id) + seq_bytes(cause_seq)

    @staticmethod
    def decay_mark(channel: str, trigger_id: str, memory_id: str) -> bytes:
        """The heat trajectory of a memory whose decay crossing a trigger fired for."""
        return join(b"d:", channel, trigger_id, memory_id)

    @staticmethod
    def delivery(idempotency_key: str) -> bytes:
        """A webhook delivery in the outbox."""
        return b"o:" + idempotency_key.encode()

    @staticmethod
    def recall(channel: str, recall_id: str) -> bytes:
        """One logged recall of a channel (recall ids sort by time)."""
        return join(b"r:", channel, recall_id)

    @staticmethod
    def feedback(channel: str, recall_id: str) -> bytes:
        """The feedback given on one logged recall."""
        return join(b"g:", channel, recall_id)

    @staticmethod
    def rejection(channel: str, memory_id: str) -> bytes:
        """The embedding a memory forgotten with ``reject`` leaves behind."""
        return join(b"n:", channel, memory_id)

    @staticmethod
    def recall_tally(channel: str) -> bytes:
        """How many recalls a channel's recall log holds."""
        return b"q:" + channel.encode()

    @staticmethod
    def quote(channel: str, memory_id: str, key: bytes) -> bytes:
        """The quote index entry saying that ``key`` holds a piece of a memory's text
        (``key`` empty: the prefix of every entry of the memory)."""
        return join(b"k:", channel, memory_id) + SEP + key

    @staticmethod
    def history(channel: str, trigger_id: str) -> bytes:
        """The prefix of every entry of a trigger's history."""
        return join(b"h:", channel, trigger_id) + SEP

    @staticmethod
    def channel_quotes(channel: str) -> bytes:
        """The prefix of every quote index entry of a channel."""
        return join(b"k:", channel) + SEP

    @staticmethod
    def trigger_ranges(channel: str) -> list[tuple[bytes, bytes]]:
        """Every key range a channel's triggers own (rules, counters, history, decay
        marks, those of triggers deleted before included), as [start, end) pairs: what
        dropping the channel removes of them."""
        prefixes = [join(family, channel) + SEP for family in TRIGGER_FAMILIES]
        return [(p, past(p)) for p in prefixes]

    @staticmethod
    def channel_ranges(channel: str) -> list[tuple[bytes, bytes]]:
        """Every key range a channel owns, as [start, end) pairs: what dropping it
        deletes (its triggers are the trigger engine's: :meth:`trigger_ranges`)."""
        prefixes = [join(family, channel) + SEP for family in CHANNEL_FAMILIES]
        exact = [Keys.policy(channel), Keys.channel_state(channel), Keys.recall_tally(channel)]
        return [(p, past(p)) for p in prefixes] + [(key, key + SEP) for key in exact]


# The families whose keys start with ``<channel>\0``: memories, their heats, embeddings,
# idempotency keys, edges, conflicts, the recall log, feedback, the quote index, rejections.
CHANNEL_FAMILIES = (b"m:", b"w:", b"v:", b"i:", b"e:", b"x:", b"r:", b"g:", b"k:", b"n:")
# The trigger engine's families, whose keys start with ``<channel>\0`` too (since schema
# version 4): rules, fire counters, history, decay marks, ratings.
TRIGGER_FAMILIES = (b"t:", b"f:", b"h:", b"d:", b"u:")


def past(prefix: bytes) -> bytes:
    """The least key after every key that starts with ``prefix`` (which ends in NUL)."""
    return prefix[:-1] + b"\x01"

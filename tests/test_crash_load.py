"""kill -9 under mixed load: what the server acknowledged survives, nothing it did not
is half-applied, no forgotten memory returns, and every index agrees with RocksDB.

Four client threads run StoreStream (one a round of 256+ items, whose vectors are
written ahead of its batch), Store, Update, Forget, Boost, Dream and Recall calls over
three channels, each on memories of its own, and record every answer. At a random
moment ``calor serve`` is killed with SIGKILL; the stopped store is checked offline
(``calor check``, and every memory written since the last check has the embedding of
its text), then the server is started again on the same data dir and questioned:

- every acknowledged store is there with its text; an acknowledged update shows its
  text (or that of an update in flight at the kill); an acknowledged forget stays
  forgotten, and no recall ever returns a forgotten memory;
- a store or stream that was not answered is all there or not at all, and no text is
  stored twice;
- an acknowledged boost's heat is still there (less only what time took), and an
  acknowledged recall's counts (a recall's heat effects answer before the disk has them:
  a crash of the server loses none);
- a recall of each memory written in the round finds it (its index entry is there).

``make test`` runs 3 rounds; ``make soak`` 20 (``SOAK_ROUNDS``). The seed is printed
and named in every failure; ``CRASH_SEED=N`` replays a run's choices.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
import pytest

from calor.models.embedder import OnnxEmbedder
from calor.server.records import DELETED
from calor.server.storage.consistency import ORPHAN_VECTOR, Checker, open_offline
from calor.v1 import memory_pb2
from calor.v1 import memory_service_pb2 as pb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from tests.calor_process import CalorProcess

CHANNELS = ("crash-a", "crash-b", "crash-c")
WORKERS = 4
EPISODIC = memory_pb2.MEMORY_TYPE_EPISODIC
GONE = memory_pb2.MEMORY_STATE_DELETED
RECALLED_STATES = {memory_pb2.MEMORY_STATE_ACTIVE, memory_pb2.MEMORY_STATE_COLD}
ALL_STATES = [s for s in memory_pb2.MemoryState.values() if s]
HALF_LIFE_S = 86_400.0  # episodic; every other type decays slower
SUMMARY_COOLING = 0.5  # dream_episode_cooling's default
RECALL_CHECKS = 60  # memories written in a round that a recall looks for afterwards
CALL_TIMEOUT_S = 60.0
_BATCH_JITTER = 0.003  # how far a text's embedding moves with the batch it is embedded in
# The least cosine between one text's embeddings from two batches: the int8 model
# quantizes a batch's activations on one scale, so a text's embedding moves with the
# texts of its length it was embedded beside (at least 0.990 measured over 900 test
# sentences in batches of 1 to 280).
_SAME_TEXT = 0.98
MIX = (
    ("stream", 24),
    ("store", 10),
    ("update", 22),
    ("boost", 20),
    ("forget", 10),
    ("recall", 10),
    ("dream", 4),
)
SUBJECTS = (
    "the heron", "Ana", "the night ferry", "our landlord", "the cellist", "Kofi",
    "the glacier guide", "grandmother", "the orchard crew", "Mateus", "the quarry foreman",
    "Priya", "the lighthouse keeper", "the saddle maker", "the tundra survey",
    "the walnut farmer", "the beacon team", "the canyon ranger", "the marble cutter",
    "the harbour pilot",
)  # fmt: skip
VERBS = (
    "repaired", "photographed", "sold", "painted", "measured", "borrowed", "lost",
    "buried", "weighed", "delivered", "repainted", "catalogued",
)  # fmt: skip
OBJECTS = (
    "a brass compass", "the violin case", "forty lanterns", "a jar of honey", "the old canoe",
    "a tide table", "the spare key", "six wool blankets", "a fossil", "the ledger",
    "a copper kettle", "the rope ladder", "two bicycles", "a telescope", "the seed catalogue",
    "a sack of flour", "the radio mast", "a chess set", "the snow chains", "a wedding photo",
)  # fmt: skip
PLACES = (
    "in Lisbon", "by the pier", "at the market", "behind the barn", "on the ridge",
    "near the station", "in the attic", "at the border", "under the bridge", "in Porto",
    "by the dunes", "at the school", "in the greenhouse", "on the island", "at dawn",
    "after the storm",
)  # fmt: skip


def sentence(rng: random.Random, tag: str) -> str:
    """A short note made unique by ``tag`` (a token of its own, for the lexical index)."""
    who, did, what, where = (rng.choice(words) for words in (SUBJECTS, VERBS, OBJECTS, PLACES))
    return f"{tag}: {who} {did} {what} {where}."


@dataclass
class Known:
    """One memory the driver knows the server holds, and what it may look like."""

    channel: str
    owner: int
    text: str
    pending_text: str | None = None  # an update sent and not answered
    former: list[str] = field(default_factory=list)  # texts an update replaced (or may have)
    forgotten: bool = False
    forgetting: bool = False  # a forget sent and not answered
    boosted: tuple[float, float] | None = None  # heat an acknowledged boost answered, when
    recalled: int = 0  # the recall count an acknowledged recall answered
    written: int = 0  # the round it was last stored or updated in


@dataclass
class Ledger:
    """Everything the server answered, and what was in flight when it died."""

    seed: int
    memories: dict[str, Known] = field(default_factory=dict)
    unanswered: list[tuple[str, int, list[str]]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    acked: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def own(self, worker: int) -> list[str]:
        """The ids a worker may update, boost or forget: its own, not forgotten."""
        with self.lock:
            return [
                i
                for i, k in self.memories.items()
                if k.owner == worker and not (k.forgotten or k.forgetting)
            ]

    def forgotten_in(self, channel: str) -> set[str]:
        with self.lock:
            return {i for i, k in self.memories.items() if k.channel == channel and k.forgotten}

    def fail(self, message: str) -> None:
        with self.lock:
            self.errors.append(message)


class Worker(threading.Thread):
    """One client: a weighted mix of calls on its own memories until the server dies."""

    def __init__(
        self, number: int, target: str, ledger: Ledger, round_: int, killing: threading.Event
    ) -> None:
        super().__init__(name=f"crash-worker-{number}", daemon=True)
        self.number, self.target, self.ledger, self.round = number, target, ledger, round_
        self.channel = CHANNELS[number % len(CHANNELS)]
        self.rng = random.Random(f"{ledger.seed}-{round_}-{number}")
        self.killing = killing
        self.count = 0

    def run(self) -> None:
        names = [name for name, _ in MIX]
        weights = [weight for _, weight in MIX]
        with grpc.insecure_channel(self.target) as channel:
            stub = MemoryServiceStub(channel)
            big = self.number == 0  # one bulk store a round, often cut short by the kill
            while not self.killing.is_set():
                op = "big_stream" if big else self.rng.choices(names, weights)[0]
                big = False
                try:
                    getattr(self, op)(stub)
                except grpc.RpcError as error:
                    if not self.killing.is_set():
                        self.ledger.fail(f"{op}: {error.code().name}: {error.details()}")
                    return

    def tag(self) -> str:
        self.count += 1
        return f"zq{self.round}w{self.number}n{self.count}"

    def _store(self, stub: MemoryServiceStub, texts: list[str]) -> None:
        entry = (self.channel, self.number, texts)
        with self.ledger.lock:
            self.ledger.unanswered.append(entry)
        requests = [
            pb.StoreStreamRequest(
                store=pb.StoreRequest(channel=self.channel, text=t, memory_type=EPISODIC)
            )
            for t in texts
        ]
        if len(texts) == 1 and self.rng.random() < 0.5:
            ids = [stub.Store(requests[0].store, timeout=CALL_TIMEOUT_S).memory.id]
        else:
            ids = list(stub.StoreStream(iter(requests), timeout=CALL_TIMEOUT_S).ids)
        with self.ledger.lock:
            self.ledger.unanswered.remove(entry)
            for memory_id, text in zip(ids, texts, strict=True):
                self.ledger.memories[memory_id] = Known(
                    self.channel, self.number, text, written=self.round
                )
            self.ledger.acked["stored"] += len(ids)

    def stream(self, stub: MemoryServiceStub) -> None:
        size = self.rng.randint(2, 12)
        self._store(stub, [sentence(self.rng, self.tag()) for _ in range(size)])

    def big_stream(self, stub: MemoryServiceStub) -> None:
        """256 items or more: their vectors are written ahead of the batch."""
        size = self.rng.randint(260, 300)
        self._store(stub, [sentence(self.rng, self.tag()) for _ in range(size)])

    def store(self, stub: MemoryServiceStub) -> None:
        self._store(stub, [sentence(self.rng, self.tag())])

    def _pick(self) -> str | None:
        own = self.ledger.own(self.number)
        return self.rng.choice(own) if own else None

    def update(self, stub: MemoryServiceStub) -> None:
        memory_id = self._pick()
        if memory_id is None:
            return
        text = sentence(self.rng, self.tag())
        known = self.ledger.memories[memory_id]
        known.pending_text = text
        known.former.append(known.text)
        request = pb.UpdateRequest(channel=self.channel, id=memory_id, text=text)
        reply = stub.Update(request, timeout=CALL_TIMEOUT_S)
        if reply.memory.text != text:
            self.ledger.fail(f"update of {memory_id} answered the text {reply.memory.text!r}")
        with self.ledger.lock:
            known.text, known.pending_text, known.written = text, None, self.round
            self.ledger.acked["updated"] += 1

    def boost(self, stub: MemoryServiceStub) -> None:
        memory_id = self._pick()
        if memory_id is None:
            return
        request = pb.BoostRequest(channel=self.channel, id=memory_id, delta=0.1)
        # The moment before the call: the server's heat in the reply is of a moment no
        # earlier, so it decays from there at least as slowly as the check assumes (a
        # moment taken after the reply was late by however long the reply took).
        asked = time.time()
        reply = stub.Boost(request, timeout=CALL_TIMEOUT_S)
        with self.ledger.lock:
            self.ledger.memories[memory_id].boosted = (reply.memory.heat, asked)
            self.ledger.acked["boosted"] += 1

    def forget(self, stub: MemoryServiceStub) -> None:
        memory_id = self._pick()
        if memory_id is None:
            return
        known = self.ledger.memories[memory_id]
        known.forgetting = True
        request = pb.ForgetRequest(channel=self.channel, ids=[memory_id])
        forgotten = stub.Forget(request, timeout=CALL_TIMEOUT_S).forgotten
        if forgotten not in (1, 2):  # 2: with the episode summary that quotes it
            self.ledger.fail(f"forget of {memory_id} answered forgotten={forgotten}")
        with self.ledger.lock:
            known.forgotten, known.forgetting = True, False
            self.ledger.acked["forgotten"] += 1

    def recall(self, stub: MemoryServiceStub) -> None:
        gone = self.ledger.forgotten_in(self.channel)
        query = f"what did {self.rng.choice(SUBJECTS)} do with {self.rng.choice(OBJECTS)}?"
        peek = self.rng.random() < 0.5
        request = pb.RecallRequest(channel=self.channel, query=query, limit=20, peek=peek)
        hits = stub.Recall(request, timeout=CALL_TIMEOUT_S).hits
        returned = gone & {hit.memory.id for hit in hits}
        if returned:
            self.ledger.fail(f"a recall returned forgotten memories {sorted(returned)}")
        if not peek:  # what it answered of its memories' recalls must survive the kill
            with self.ledger.lock:
                for hit in hits:
                    known = self.ledger.memories.get(hit.memory.id)
                    if known is not None:
                        known.recalled = max(known.recalled, hit.memory.recall_count)
                self.ledger.acked["recalled"] += 1

    def dream(self, stub: MemoryServiceStub) -> None:
        stub.Dream(pb.DreamRequest(channel=self.channel), timeout=CALL_TIMEOUT_S)
        with self.ledger.lock:
            self.ledger.acked["dreams"] += 1


def every_memory(stub: MemoryServiceStub, channel: str) -> Iterator[memory_pb2.Memory]:
    """Every memory of a channel, forgotten ones included, page by page."""
    token = ""
    while True:
        request = pb.ListMemoriesRequest(
            channel=channel, page_size=1000, page_token=token, states=ALL_STATES
        )
        page = stub.ListMemories(request, timeout=CALL_TIMEOUT_S)
        yield from page.memories
        token = page.next_page_token
        if not token:
            return


class Verdict:
    """Failures found by one check, each prefixed with the seed and round."""

    def __init__(self, seed: int, round_: int) -> None:
        self.where = f"seed {seed}, round {round_}"
        self.failures: list[str] = []

    def expect(self, holds: bool, message: str) -> None:
        if not holds:
            self.failures.append(message)

    def done(self) -> None:
        shown = "\n".join(self.failures[:30])
        assert not self.failures, f"{self.where}: {len(self.failures)} failures\n{shown}"


def check_server(target: str, ledger: Ledger, round_: int) -> int:
    """Question the restarted server; settles what was in flight. Returns how many
    memories were found by a recall of their text."""
    verdict = Verdict(ledger.seed, round_)
    with grpc.insecure_channel(target) as channel:
        stub = MemoryServiceStub(channel)
        found = {m.id: m for name in CHANNELS for m in every_memory(stub, name)}
        by_text: dict[str, str] = {}
        for memory in found.values():
            verdict.expect(memory.text not in by_text, f"{memory.text!r} is stored twice")
            if memory.text:
                by_text[memory.text] = memory.id
        _check_unanswered(ledger, by_text, verdict, round_)
        for memory_id, known in ledger.memories.items():
            memory = found.get(memory_id)
            if memory is None:
                verdict.expect(False, f"acknowledged memory {memory_id} is lost")
                continue
            _check_memory(memory, known, verdict, round_)
        written = [
            i
            for i, k in ledger.memories.items()
            if k.written == round_ and not k.forgotten and found[i].state in RECALLED_STATES
        ]
        rng = random.Random(f"{ledger.seed}-{round_}-recall")
        sample = rng.sample(written, min(RECALL_CHECKS, len(written)))
        forgotten = {i for i, k in ledger.memories.items() if k.forgotten}
        for memory_id in sample:
            known = ledger.memories[memory_id]
            request = pb.RecallRequest(channel=known.channel, query=known.text, limit=20, peek=True)
            hits = {h.memory.id for h in stub.Recall(request, timeout=CALL_TIMEOUT_S).hits}
            verdict.expect(memory_id in hits, f"a recall of {known.text!r} misses {memory_id}")
            verdict.expect(not hits & forgotten, f"a recall returned {hits & forgotten}")
    verdict.done()
    return len(sample)


def _check_unanswered(
    ledger: Ledger, by_text: dict[str, str], verdict: Verdict, round_: int
) -> None:
    """A store or stream in flight at the kill is all there or not at all; what is
    there is known from now on."""
    for channel, owner, texts in ledger.unanswered:
        there = [t for t in texts if t in by_text]
        verdict.expect(
            len(there) in (0, len(texts)),
            f"a stream of {len(texts)} was half applied: {len(there)} stored",
        )
        for text in there:
            ledger.memories[by_text[text]] = Known(channel, owner, text, written=round_)
        ledger.acked["unanswered stores committed" if there else "unanswered stores absent"] += 1
    ledger.unanswered.clear()


def _check_memory(memory: memory_pb2.Memory, known: Known, verdict: Verdict, round_: int) -> None:
    """One memory against what was acknowledged; what was in flight is settled. A boost
    holds but for what a dream's episode summary takes, once (half, by default)."""
    if known.forgetting:  # the forget may or may not have committed
        known.forgotten, known.forgetting = memory.state == GONE, False
    if known.forgotten:
        verdict.expect(memory.state == GONE, f"forgotten {memory.id} is back: {memory.state}")
        verdict.expect(not memory.text, f"forgotten {memory.id} kept its text")
        return
    verdict.expect(memory.state != GONE, f"{memory.id} is forgotten; no forget was answered")
    allowed = {known.text, known.pending_text}
    verdict.expect(memory.text in allowed, f"{memory.id} reads {memory.text!r}, not {allowed}")
    if memory.text == known.pending_text:
        known.text, known.written = memory.text, round_
    known.pending_text = None
    if known.boosted is not None and memory.state in RECALLED_STATES:
        heat, when = known.boosted
        floor = heat * 2 ** (-(time.time() - when + 1.0) / HALF_LIFE_S) - 1e-9
        if "summarised_in" in memory.tags:
            floor *= 1.0 - SUMMARY_COOLING
        verdict.expect(memory.heat >= floor, f"{memory.id} lost its boost: {memory.heat} < {floor}")
    verdict.expect(
        memory.recall_count >= known.recalled,
        f"{memory.id} lost recalls: {memory.recall_count} < {known.recalled} acknowledged",
    )


def check_store(
    data_dir: Path, embedder: OnnxEmbedder, ledger: Ledger, round_: int, killed: bool
) -> int:
    """``calor check`` on the stopped store, and the embedding of every memory written
    this round is the embedding of its text. Returns how many embeddings were compared.

    After a kill, staged vectors of a bulk store that never committed are the one thing
    allowed (orphan embeddings of no acknowledged memory): the next start drops them.
    """
    verdict = Verdict(ledger.seed, round_)
    store = open_offline(data_dir, model_id=embedder.model_id, dim=embedder.dim)
    try:
        problems = Checker(store).run()
        for problem in problems:
            staged = killed and problem.kind == ORPHAN_VECTOR
            verdict.expect(staged, f"calor check: {problem}")
            named = [i for i in ledger.memories if i in problem.detail]
            verdict.expect(not named, f"calor check: {problem} (an acknowledged memory)")
        written = {(k.channel, i) for i, k in ledger.memories.items() if k.written == round_}
        texts: dict[str, str] = {}
        for channel, _, stream in ledger.unanswered:
            texts.update(dict.fromkeys(stream, channel))
        records = [
            r
            for r in store.records()
            if r.state != DELETED and ((r.channel, r.id) in written or r.text in texts)
        ]
        # An embedding is its text's when no other text is nearer by more than the
        # batch jitter: not another memory's of the round (two may differ in their tag
        # alone), nor a text an update replaced (the vector must have moved with it).
        former = {t for r in records for t in _former(ledger, r.id)} - {r.text for r in records}
        compared = [r.text for r in records] + sorted(former)
        vectors = embedder.embed_passages(compared) if records else None
        for n, record in enumerate(records):
            stored = store.get_vector(record.channel, record.id)
            if stored is None:
                verdict.expect(False, f"{record.id} has no embedding")
                continue
            assert vectors is not None
            similarities = vectors @ stored
            nearest = int(np.argmax(similarities))
            verdict.expect(
                similarities[n] >= similarities[nearest] - _BATCH_JITTER
                and similarities[n] > _SAME_TEXT,
                f"{record.id}: its embedding is of {compared[nearest]!r} "
                f"({similarities[nearest]:.4f}), not of {record.text!r} ({similarities[n]:.4f})",
            )
    finally:
        store.close()
    verdict.done()
    return len(records)


def _former(ledger: Ledger, memory_id: str) -> list[str]:
    """The texts a memory held before (or would hold after) an update: none is its text
    unless the memory holds it now."""
    known = ledger.memories.get(memory_id)
    if known is None:
        return []
    return [*known.former, *([known.pending_text] if known.pending_text else [])]


def run_rounds(tmp_path: Path, embedder: OnnxEmbedder, rounds: int) -> None:
    seed = int(os.environ.get("CRASH_SEED") or random.SystemRandom().randrange(2**31))
    print(f"\ncrash under load: seed {seed} (CRASH_SEED={seed} replays it), {rounds} rounds")
    rng = random.Random(seed)
    ledger = Ledger(seed)
    data_dir = tmp_path / "data"
    server = CalorProcess(data_dir, tmp_path / "server.log")
    recalled = compared = 0
    checking = questioning = 0.0
    restarts: list[float] = []
    try:
        server.start()
        for round_ in range(1, rounds + 1):
            killing = threading.Event()
            workers = [Worker(n, server.target, ledger, round_, killing) for n in range(WORKERS)]
            for worker in workers:
                worker.start()
            time.sleep(rng.uniform(1.0, 4.0))
            killing.set()
            server.kill()
            for worker in workers:
                worker.join(CALL_TIMEOUT_S)
            assert not ledger.errors, f"seed {seed}, round {round_}: {ledger.errors[:10]}"
            began = time.monotonic()
            compared += check_store(data_dir, embedder, ledger, round_, killed=True)
            checking += time.monotonic() - began
            restarts.append(server.start())
            began = time.monotonic()
            recalled += check_server(server.target, ledger, round_)
            questioning += time.monotonic() - began
        assert server.stop() == 0, server.log_tail()
        check_store(data_dir, embedder, ledger, rounds + 1, killed=False)
    finally:
        server.close()
    live = sum(not k.forgotten for k in ledger.memories.values())
    print(
        f"{rounds} kills: acknowledged {dict(ledger.acked)}; {live} memories live at the end; "
        f"{compared} embeddings compared with their texts, {recalled} recalls checked; "
        f"restarts {max(restarts):.1f} s at most, offline checks {checking:.1f} s, "
        f"questioning {questioning:.1f} s"
    )
    assert ledger.acked["stored"] > 0 and ledger.acked["updated"] + ledger.acked["boosted"] > 0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_kill_9_under_mixed_load_loses_nothing_acknowledged(
    tmp_path: Path, embedder: OnnxEmbedder
) -> None:
    run_rounds(tmp_path, embedder, rounds=3)


@pytest.mark.soak
@pytest.mark.timeout(3600)
def test_kill_9_under_mixed_load_soak(tmp_path: Path, embedder: OnnxEmbedder) -> None:
    run_rounds(tmp_path, embedder, rounds=int(os.environ.get("SOAK_ROUNDS", "20")))

"""Kill drills on a local cluster: clients storing and recalling through every live node,
a trigger firing on each store, a subscriber following the events across node deaths,
and Calor nodes and NATS servers killed with -9 at random moments; then the check that
no acknowledged write was lost or applied twice, that each store fired its trigger
once, and that the subscriber saw every event once.

    python -m calor.server.cluster.drill [--kills 20] [--kinds owner+nats] [--seed N]

prints a line per kill and a summary (the cluster tests and ``make bench-cluster`` run
the same drill).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from calor.server.cluster.drill_load import (
    ANSWER_SECONDS,
    CALL_SECONDS,
    CHANNELS,
    NOTIFIED,
    STORED,
    Follower,
    Load,
    Nodes,
    Writes,
    owns_the_store,
)
from calor.server.cluster.local import LocalCluster, wait_for_port
from calor.v1 import memory_service_pb2 as pb
from calor.v1 import trigger_service_pb2 as tpb

__all__ = ["CHANNELS", "KINDS", "Drill", "Report", "owns_the_store"]

KINDS = ("node", "owner", "nats", "both", "owner+nats")
"""What a round kills: a random Calor node, the node that owns the first channel's shard,
a random NATS server, or a random node or that owner with a NATS server at the same
moment."""


@dataclass
class Report:
    """What a drill found."""

    rounds: list[dict[str, Any]]
    writes_acknowledged: int
    calls_failed: int
    recalls_answered: int
    lost: int
    """Acknowledged writes missing from what some node answers."""
    duplicated: int
    """Texts stored more than once, in what some node answers."""
    events_missed: int
    """Memories in the store whose ON_STORE event the subscriber never saw."""
    events_repeated: int
    """Events the subscriber saw more than once."""
    events_out_of_order: int
    resubscriptions: int
    firings_missed: int
    """Stores whose trigger (a notify on every store) never fired."""
    firings_repeated: int
    """Stores whose trigger fired more than once."""

    @property
    def recoveries(self) -> list[float]:
        """Seconds from each kill until every channel took a write again, sorted."""
        return sorted(r["recovery_s"] for r in self.rounds)

    def as_json(self) -> dict[str, Any]:
        recoveries = self.recoveries
        return {
            **{k: v for k, v in self.__dict__.items() if k != "rounds"},
            "kills": len(self.rounds),
            "recovery_s": {
                "median": round(recoveries[len(recoveries) // 2], 2) if recoveries else None,
                "max": round(recoveries[-1], 2) if recoveries else None,
                "within_10_s": sum(1 for r in recoveries if r <= 10.0),
            },
            "rounds": self.rounds,
        }


class Drill:
    """Kill rounds on ``cluster`` (started) under the load of ``CLIENTS`` clients and one
    subscriber; ``say`` hears a line per round."""

    def __init__(
        self, cluster: LocalCluster, seed: int, say: Callable[[str], None] = print
    ) -> None:
        self.cluster = cluster
        self._rng = random.Random(seed)
        self._say = say
        self._nodes = Nodes(cluster)
        self._writes = Writes()

    def run(self, kinds: Sequence[str]) -> Report:
        """One round per kind in ``kinds``, then the check."""
        for channel in CHANNELS:  # a notify on each store, fired on the owner
            trigger = tpb.Trigger(
                id=f"notify-{channel}",
                channel=channel,
                event=STORED,
                action=tpb.ACTION_KIND_NOTIFY,
                config={"message": "a store in the drill"},
            )
            self._create(tpb.CreateTriggerRequest(trigger=trigger))
        self.every_channel_answers()
        load, follower = Load(self._nodes, self._writes), Follower(self._nodes)
        load.start()
        follower.start()
        rounds: list[dict[str, Any]] = []
        try:
            for number, kind in enumerate(kinds):
                time.sleep(self._rng.uniform(1.0, 3.0))
                rounds.append(self._round(number, kind, follower))
            time.sleep(2.0)
        finally:
            load.stop()
        for number in self.cluster.exited():
            self._say(f"node-{number} stopped by itself; started again for the check")
            self.cluster.start_node(number)
        self.every_channel_answers()
        self._wait_for_events(follower)
        follower.stop()
        return self._check(rounds, follower)

    def _create(self, request: tpb.CreateTriggerRequest) -> None:
        """Create a trigger through a live node, tried again until one answers."""
        give_up = time.monotonic() + ANSWER_SECONDS
        while True:
            node = self._nodes.any_live(self._rng)
            try:
                self._nodes.triggers[node].CreateTrigger(request, timeout=CALL_SECONDS)
                return
            except grpc.RpcError as error:
                if error.code() == grpc.StatusCode.ALREADY_EXISTS:
                    return  # an earlier try made it; its answer was lost
                if time.monotonic() > give_up:
                    raise
                time.sleep(0.1)

    def _round(self, number: int, kind: str, follower: Follower) -> dict[str, Any]:
        rng, cluster = self._rng, self.cluster
        node = server = None
        owner = self._nodes.owner()
        if kind in ("owner", "owner+nats") and owner is not None:
            node = owner
        elif kind in ("node", "both", "owner", "owner+nats"):
            node = rng.choice(cluster.live())
        if kind in ("nats", "both", "owner+nats"):
            server = rng.randrange(len(cluster.nats.client_ports))
        killed_at = time.time()
        cut = node is not None and node == follower.node
        if node is not None:
            cluster.kill_node(node)
        if server is not None:
            cluster.nats.kill(server)
        answered = self.every_channel_answers()
        recovered = max(answered.values())
        killed = []
        if node is not None:
            killed.append(f"node-{node}" + (" (the owner)" if node == owner else ""))
        if server is not None:
            killed.append(f"NATS server n{server}")
        self._say(
            f"round {number} ({kind}): killed {' and '.join(killed)}; every channel answered after "
            f"{recovered:.2f} s"
        )
        stopped = cluster.exited()  # nodes that found they lost the store stop themselves
        if stopped:
            self._say(f"  nodes that stopped by themselves, started again: {stopped}")
        if server is not None:
            cluster.nats.start_server(server)
            wait_for_port(cluster.nats.client_ports[server], 60.0)
        for number in [*stopped, *([] if node is None else [node])]:
            cluster.start_node(number)  # until it serves: it joined again
        cluster.nats.wait_whole()  # the next round kills one server of a whole cluster
        return {
            "round": number,
            "kind": kind,
            "node": node,
            "owner_killed": node is not None and node == owner,
            "subscriber_cut": cut,
            "nats": server,
            "stopped_by_themselves": stopped,
            "killed_at": round(killed_at, 3),
            "recovery_s": round(recovered, 3),
            "answered_s": answered,
        }

    def every_channel_answers(self) -> dict[str, float]:
        """Seconds until a write to each channel through a live node was acknowledged,
        every channel probed at once."""
        started = time.monotonic()
        seeds = {channel: self._rng.random() for channel in CHANNELS}

        def probe(channel: str) -> float:
            text = f"probe of {channel} at {time.time_ns()}"
            rng = random.Random(seeds[channel])  # which live node each try goes through
            if not self._writes.store(self._nodes, rng, channel, text):
                raise TimeoutError(f"{channel} did not answer in {ANSWER_SECONDS} s")
            return round(time.monotonic() - started, 3)

        with ThreadPoolExecutor(len(CHANNELS), thread_name_prefix="drill-probe") as probes:
            return dict(zip(CHANNELS, probes.map(probe, CHANNELS), strict=True))

    def _stored(self, number: int) -> dict[str, list[tuple[str, str]]]:
        """Every live memory of each drill channel, as node ``number`` answers (asked
        again while a shard is between owners: a node that came back takes its share)."""
        found: dict[str, list[tuple[str, str]]] = {}
        for channel in CHANNELS:
            token, found[channel] = "", []
            while True:
                request = pb.ListMemoriesRequest(channel=channel, page_size=1000, page_token=token)
                page = self._list(number, request)
                found[channel] += [(m.id, m.text) for m in page.memories]
                token = page.next_page_token
                if not token:
                    break
        return found

    def _list(self, number: int, request: pb.ListMemoriesRequest) -> pb.ListMemoriesResponse:
        give_up = time.monotonic() + ANSWER_SECONDS
        while True:
            try:
                return self._nodes.memory[number].ListMemories(request, timeout=CALL_SECONDS)
            except grpc.RpcError as error:
                if error.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > give_up:
                    raise
            time.sleep(0.1)

    def _wait_for_events(self, follower: Follower, seconds: float = 60.0) -> None:
        """Let the subscriber catch up with the stores made (and not told) last, and with
        their triggers' firings."""
        stored = {i for view in self._stored(self.cluster.live()[0]).values() for i, _ in view}
        give_up = time.monotonic() + seconds
        while time.monotonic() < give_up:
            seen = list(follower.seen)
            stores = {e.memory_id for e in seen if e.kind == STORED and e.memory_id in stored}
            notified = {e.memory_id for e in seen if e.kind == NOTIFIED}
            if len(stores) >= len(stored) and stores <= notified:
                return
            time.sleep(0.2)

    def _check(self, rounds: list[dict[str, Any]], follower: Follower) -> Report:
        lost = duplicated = 0
        every_id: set[str] = set()
        for number in self.cluster.live():
            views = self._stored(number)
            texts = Counter(text for view in views.values() for _, text in view)
            ids = {text: i for view in views.values() for i, text in view}
            every_id |= set(ids.values())
            duplicated += sum(1 for count in texts.values() if count > 1)
            lost += sum(1 for text, i in self._writes.acked.items() if ids.get(text) != i)
        seen = follower.seen
        seqs = [e.seq for e in seen]
        events = Counter(seqs)
        stores = {e.memory_id for e in seen if e.kind == STORED}
        fired = Counter(e.memory_id for e in seen if e.kind == NOTIFIED)
        return Report(
            rounds=rounds,
            writes_acknowledged=len(self._writes.acked),
            calls_failed=self._writes.failed_calls,
            recalls_answered=self._writes.recalls,
            lost=lost,
            duplicated=duplicated,
            events_missed=len(every_id - {e.memory_id for e in seen if e.kind == STORED}),
            events_repeated=sum(count - 1 for count in events.values()),
            events_out_of_order=sum(1 for a, b in zip(seqs, seqs[1:], strict=False) if b <= a),
            resubscriptions=follower.resumed,
            firings_missed=len(stores - set(fired)),
            firings_repeated=sum(1 for count in fired.values() if count > 1),
        )

    def close(self) -> None:
        self._nodes.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Run a drill on a fresh local cluster in a temporary folder."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=20, help="rounds (default 20)")
    parser.add_argument(
        "--kinds",
        default="owner+nats",
        help=f"what rounds kill, in turn, comma-separated, of {', '.join(KINDS)}",
    )
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--shards", type=int, default=1, help="the cluster's shards (default 1)")
    parser.add_argument("--keep", action="store_true", help="keep the nodes' data and logs")
    args = parser.parse_args(argv)
    kinds = args.kinds.split(",")
    if unknown := set(kinds) - set(KINDS):
        parser.error(f"unknown kinds {sorted(unknown)}; known: {', '.join(KINDS)}")
    seed = random.randrange(1 << 30) if args.seed is None else args.seed
    root = Path(tempfile.mkdtemp(prefix="calor-drill-"))
    cluster = LocalCluster(root)
    cluster.options = ["--shards", str(args.shards)]
    print(f"drill in {root}, seed {seed}, {args.shards} shards", flush=True)
    try:
        cluster.start()
        drill = Drill(cluster, seed, lambda line: print(line, flush=True))
        try:
            report = drill.run([kinds[n % len(kinds)] for n in range(args.kills)])
        finally:
            drill.close()
    finally:
        cluster.stop()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(report.as_json(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

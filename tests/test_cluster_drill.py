"""Kills under load (``calor.server.cluster.drill``): 8 clients store and recall through
every node of a 3-node cluster on 3 NATS servers, a notify trigger fires on each store,
and a subscriber follows the events; Calor nodes and NATS servers are killed with -9 at
random moments. Afterwards every acknowledged write is there once through every node,
every channel answers, each store fired its trigger once (on whichever node owned the
store then), and the subscriber, resubscribing through live nodes when its stream
ended, saw every event once and in order.

``make test`` kills the owner, then a NATS server, then both at once; ``make soak`` runs
``SOAK_ROUNDS`` rounds (20) of every kind in turn. The seed is printed; ``DRILL_SEED=N``
replays the run's choices. The time each kill took to recover from is printed and
measured by ``make bench-cluster``, not asserted here.
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from pathlib import Path

import pytest

from calor.server.cluster.drill import KINDS, Drill, Report
from calor.server.cluster.local import LocalCluster


def drill(tmp_path: Path, kinds: Sequence[str], shards: int = 3) -> Report:
    seed = int(os.environ.get("DRILL_SEED") or random.randrange(1 << 30))
    print(f"drill seed {seed} (DRILL_SEED={seed} replays it), {shards} shards")
    cluster = LocalCluster(tmp_path)
    cluster.options = ["--shards", str(shards)]
    try:
        cluster.start()
        run = Drill(cluster, seed)
        try:
            return run.run(kinds)
        finally:
            run.close()
    finally:
        cluster.stop()


def check(report: Report, kills: int) -> None:
    summary = {k: v for k, v in report.as_json().items() if k != "rounds"}
    print(f"drill: {summary}")  # shown with the rounds when a check fails
    assert len(report.rounds) == kills
    assert report.writes_acknowledged > 0 and report.recalls_answered > 0
    assert (report.lost, report.duplicated) == (0, 0)
    missed, repeated, disordered = (
        report.events_missed,
        report.events_repeated,
        report.events_out_of_order,
    )
    assert (missed, repeated, disordered) == (0, 0, 0)
    assert (report.firings_missed, report.firings_repeated) == (0, 0)
    cut = sum(1 for r in report.rounds if r["subscriber_cut"])
    assert report.resubscriptions >= cut, "the subscriber followed across its node's deaths"


@pytest.mark.timeout(600)
def test_killing_the_owner_a_nats_server_and_both_under_load_loses_nothing(
    tmp_path: Path,
) -> None:
    kinds = ["owner", "nats", "owner+nats"]
    check(drill(tmp_path, kinds), len(kinds))


@pytest.mark.soak
@pytest.mark.timeout(3600)
def test_kill_rounds_of_every_kind_under_load_lose_nothing_soak(tmp_path: Path) -> None:
    rounds = int(os.environ.get("SOAK_ROUNDS", "20"))
    check(drill(tmp_path, [KINDS[n % len(KINDS)] for n in range(rounds)]), rounds)

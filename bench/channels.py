"""Many small channels: start-up to SERVING and the first recall on a channel not loaded
yet, at several channel counts (issue 13, item 6).

The data is written in this process straight through the store, as the server writes a
stored memory (record, embedding, the channel's state), with GENERATED unit vectors and
short generated texts, and without the store pipeline's graph links: a million memories
through the model would take most of an hour here. Then ``calor serve`` starts on it:
seconds from spawn to health SERVING; then one peek recall on each of 50 channels from
the end of the name order, which the background warm-up loads last, so each is loaded by
the recall itself; then one more on each, loaded. Every query is a new one (the model
embeds it: end to end, as a client sees it).

```
.venv/bin/python bench/channels.py [--channels 1000,10000] [--per-channel 100] [--out DIR]
```
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from _peers_server import PeerServer
from throughput import machine_info, summarize, write_results

from calor.server.clock import SystemClock
from calor.server.embedding import load_model
from calor.server.engine.changes import Changes, commit
from calor.server.ids import new_id
from calor.server.records import MemoryRecord
from calor.server.storage.store import MemoryStore
from calor.server.thermo.channel_state import ChannelState
from calor.v1 import memory_service_pb2 as pb

Json = dict[str, Any]
ASKED = 50
WORDS = "harbour ledger violin orchard comet lantern glacier meadow copper quill".split()


def channel_name(i: int) -> str:
    return f"agent-{i:06d}"


def write_channels(folder: Path, channels: int, per_channel: int, seed: int = 3) -> float:
    """Write the channels through the store; returns the seconds it took."""
    model = load_model()
    store = MemoryStore.open(folder, model_id=model.model_id, dim=model.dim)
    rng = np.random.default_rng(seed)
    now = SystemClock().now()
    started = time.perf_counter()
    try:
        for c in range(channels):
            name = channel_name(c)
            change = Changes(name)
            vectors = rng.standard_normal((per_channel, model.dim)).astype(np.float32)
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
            for i, vector in enumerate(vectors):
                words = " ".join(WORDS[(c + i * k) % len(WORDS)] for k in (1, 3, 7))
                record = MemoryRecord(
                    id=new_id(now),
                    channel=name,
                    text=f"Note {i} of {name}: the {words}.",
                    memory_type="episodic",
                    created_at=now,
                    updated_at=now,
                    heat0=1.0,
                    t0=now,
                )
                change.add(record, vector)
            change.set_state(ChannelState(interactions=per_channel))
            commit(store, [change])
    finally:
        store.close()
    return time.perf_counter() - started


def measure(channels: int, per_channel: int) -> Json:
    """One channel count: write, start, recall on channels not loaded yet."""
    server = PeerServer()
    try:
        server.wait_ready()
        server.stop()
        written = write_channels(server.data_dir, channels, per_channel)
        serving = server.restart()
        since = time.perf_counter()
        rss_serving = server.rss_mb()
        asked = [channel_name(channels - 1 - i) for i in range(min(ASKED, channels))]
        first: list[float] = []
        for name in asked:
            query = f"the copper lantern of {name}"  # each its own: the model embeds it
            request = pb.RecallRequest(channel=name, query=query, peek=True)
            start = time.perf_counter()
            reply = server.stub.Recall(request, timeout=60.0)
            first.append((time.perf_counter() - start) * 1000)
            if not reply.hits:
                raise RuntimeError(f"channel {name} answered no hits")
        asked_by = time.perf_counter() - since
        again = []
        for name in asked:
            query = f"which note of {name} names the comet"
            request = pb.RecallRequest(channel=name, query=query, peek=True)
            start = time.perf_counter()
            server.stub.Recall(request, timeout=60.0)
            again.append((time.perf_counter() - start) * 1000)
        warm = _warmed(server, since)
        return {
            "channels": channels,
            "per_channel": per_channel,
            "memories": channels * per_channel,
            "write_s": round(written, 1),
            "data_mb": server.data_mb(),
            "serving_s": round(serving, 2),
            "rss_at_serving_mb": rss_serving,
            "first_recalls_done_s": round(asked_by, 2),
            "warm_up_done_s": warm,
            "first_recall_ms": summarize(first),
            "loaded_recall_ms": summarize(again),
        }
    finally:
        server.close()


def _warmed(server: PeerServer, since: float, timeout: float = 600.0) -> float | None:
    """Seconds from SERVING until the server logged that every channel was loaded."""
    while time.perf_counter() - since < timeout:
        if "stored channels loaded" in server.log_path.read_text(errors="replace"):
            return round(time.perf_counter() - since, 1)
        time.sleep(0.2)
    return None


def render(report: Json) -> str:
    lines = [
        f"Many channels ({report['machine']['cpu']}, {report['machine']['nproc']} CPUs); "
        "generated vectors and texts, written through the store (no graph links)",
        f"  {'channels':>9}{'memories':>10}{'SERVING s':>11}{'first recall p50/p99 ms':>26}"
        f"{'loaded p50 ms':>15}{'asked by s':>12}{'all loaded s':>14}",
    ]
    for row in report["sizes"]:
        first, again = row["first_recall_ms"], row["loaded_recall_ms"]
        lines.append(
            f"  {row['channels']:>9}{row['memories']:>10}{row['serving_s']:>11.2f}"
            f"{first['p50_ms']:>14.1f} / {first['p99_ms']:<9.1f}{again['p50_ms']:>15.1f}"
            f"{row['first_recalls_done_s']:>12.1f}{row['warm_up_done_s'] or float('nan'):>14.1f}"
        )
    lines.append(
        "  (first recalls on channels the warm-up loads last: loaded by the recall itself "
        "when 'asked by' comes before 'all loaded')"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--channels", default="1000,10000")
    parser.add_argument("--per-channel", type=int, default=100)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    counts = [int(part) for part in args.channels.split(",") if part]
    report: Json = {
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine_info(),
        "generated": "vectors and texts generated; records written through the store",
        "sizes": [measure(count, args.per_channel) for count in counts],
    }
    print(render(report))
    print(f"wrote {write_results(report, args.out, name='channels')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What ``bench/peers.py`` and its ChromaDB worker share: timing loops, the concurrent
client runner, resident memory and the in-process model.

Kept free of anything Calor-server or ChromaDB specific, so that the worker
subprocess (``_peers_chroma.py``) and the bench process time things the same way.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

# Beside this module, so on sys.path when a bench script runs as `python bench/NAME.py`.
from throughput import summarize

Json = dict[str, Any]

WARMUP_TEXTS = 64
WARMUP_QUERIES = 50
EMBED_REPEATS = 5

Call = Callable[[int], object]
"""One client's request number ``i``; what it returns is ignored."""

ClientFactory = Callable[[int], AbstractContextManager[Call]]
"""Opens client number ``c`` (a connection of its own, say) and yields its call."""


def timed_ms(call: Call, count: int) -> list[float]:
    """Milliseconds of ``count`` sequential calls ``call(0) ... call(count - 1)``."""
    times: list[float] = []
    for i in range(count):
        started = time.perf_counter()
        call(i)
        times.append((time.perf_counter() - started) * 1000)
    return times


def run_clients(open_client: ClientFactory, clients: int, seconds: float) -> Json:
    """``clients`` threads, each with its own client, call as fast as answers come for
    ``seconds``; a call started before the deadline is counted when it ends.

    Returns:
        Calls completed, the wall seconds until the last one ended, calls per second
        over that time, and the latency percentiles of every call.
    """
    opened = threading.Barrier(clients + 1)
    go = threading.Event()
    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors: list[BaseException] = []
    deadline = 0.0

    def client(number: int) -> None:
        try:
            with open_client(number) as call:
                opened.wait()
                go.wait()
                i = 0
                while time.perf_counter() < deadline:
                    began = time.perf_counter()
                    call(i)
                    latencies[number].append((time.perf_counter() - began) * 1000)
                    i += 1
        except BaseException as error:  # reported below, in the calling thread
            errors.append(error)
            opened.abort()

    threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(clients)]
    for thread in threads:
        thread.start()
    try:
        opened.wait()
    except threading.BrokenBarrierError:
        pass  # a client failed to open: raised below
    began = time.perf_counter()
    deadline = began + seconds
    go.set()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - began
    if errors:
        raise RuntimeError(f"a client failed: {errors[0]!r}") from errors[0]
    every = [ms for per_client in latencies for ms in per_client]
    return {
        "clients": clients,
        "seconds": round(wall, 2),
        "calls": len(every),
        "per_s": round(len(every) / wall, 1),
        **summarize(every),
    }


def load_embedder() -> Any:
    """The embedder the server itself loads (``calor.server.embedding.load_model``), with
    the server's default passage runs (side by side, one thread each)."""
    from calor.server.config import ServerConfig
    from calor.server.embedding import load_model

    return load_model(threads=ServerConfig.model_threads)


def query_embed_ms(
    embedder: Any, queries: Sequence[str], warmup: Sequence[str], repeats: int = EMBED_REPEATS
) -> list[float]:
    """Each query's median milliseconds to embed alone (``embed_queries([q])``) over
    ``repeats`` runs, after embedding the ``warmup`` queries once each."""
    for query in warmup:
        embedder.embed_queries([query])
    medians: list[float] = []
    for query in queries:

        def embed(_: int, text: str = query) -> object:
            return embedder.embed_queries([text])

        medians.append(float(np.median(timed_ms(embed, repeats))))
    return medians


@dataclass
class Workload:
    """What every system is given at one size: the texts to store; the queries (warm-up,
    peek and non-peek sets, disjoint, so no cache of query embeddings can flatter a
    later set); the pool the concurrent clients draw from (texts asked nowhere else,
    dealt out in turn so none repeats until the pool runs out); the concurrent run's
    shape."""

    texts: list[str]
    warmup: list[str]
    peek: list[str]
    nonpeek: list[str]
    pool: list[str]
    clients: int
    seconds: float

    @classmethod
    def split(
        cls,
        texts: list[str],
        queries: list[str],
        pool: list[str],
        peek: int,
        nonpeek: int,
        clients: int,
        seconds: float,
    ) -> Workload:
        """Cut ``queries`` into the warm-up, peek and non-peek sets, in that order."""
        first, second = WARMUP_QUERIES, WARMUP_QUERIES + peek
        return cls(
            texts,
            queries[:first],
            queries[first:second],
            queries[second : second + nonpeek],
            pool,
            clients,
            seconds,
        )

    def concurrent_query(self, client: int, i: int) -> str:
        """The ``i``-th query of concurrent client number ``client``."""
        return self.pool[(client + self.clients * i) % len(self.pool)]

    def repeats(self, calls: int) -> int:
        """How many of ``calls`` concurrent queries repeated an earlier one."""
        return max(0, calls - len(self.pool))

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)))

    @classmethod
    def load(cls, path: Path) -> Workload:
        return cls(**json.loads(path.read_text()))


class CpuWatch:
    """How much of the machine's CPU other processes used while a phase ran: the busy
    time in ``/proc/stat`` minus this process's and its reaped children's CPU time. The
    phase's own processes must have been waited for when ``stop`` is called."""

    def __init__(self, waited_s: float = 0.0) -> None:
        self.waited_s = waited_s  # how long the phase waited for a quiet CPU first
        self._busy, self._ours = _machine_busy_s(), _our_cpu_s()
        self._started = time.perf_counter()

    def stop(self) -> Json:
        """The phase's wall seconds and the core-seconds others used (None off Linux)."""
        wall = time.perf_counter() - self._started
        busy = _machine_busy_s()
        result: Json = {"phase_s": round(wall, 1), "others_core_s": None}
        if busy is not None and self._busy is not None:
            others = max(0.0, (busy - self._busy) - (_our_cpu_s() - self._ours))
            result["others_core_s"] = round(others, 2)
        return result | ({"quiet_wait_s": self.waited_s} if self.waited_s else {})


def _machine_busy_s() -> float | None:
    """CPU seconds all cores have spent busy since boot (Linux), or None."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:9]
    except (OSError, IndexError):
        return None
    ticks = [int(value) for value in fields]
    idle = ticks[3] + ticks[4]  # idle and iowait
    return (sum(ticks) - idle) / os.sysconf("SC_CLK_TCK")


def _our_cpu_s() -> float:
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


@dataclass(frozen=True)
class Patience:
    """How a phase copes with a shared machine: it waits up to ``quiet_wait`` seconds
    for a quiet CPU first, and runs again (up to ``retries`` more times, keeping the
    least disturbed run) while other processes took more than ``busy_share`` of a core
    on average during it."""

    quiet_wait: float = 0.0
    retries: int = 0
    busy_share: float = 0.2


def cleanest(label: str, patience: Patience, measure: Callable[[], Json]) -> Json:
    """``measure()`` as one phase, with the CPU watched (``phase_s``, ``others_core_s``,
    ``attempts``); again while others disturbed it, as ``patience`` allows."""
    best: Json | None = None
    for attempt in range(1, patience.retries + 2):
        watch = phase(label, patience.quiet_wait)
        result = measure() | watch.stop() | {"attempts": attempt}
        if best is None or _busy_share(result) < _busy_share(best):
            best = result
        if _busy_share(result) <= patience.busy_share:
            break
        if attempt <= patience.retries:
            print(
                f"  others used {result['others_core_s']} core-s of {result['phase_s']} s: "
                "measuring again",
                flush=True,
            )
    assert best is not None
    return best | {"attempts": attempt}


def _busy_share(result: Json) -> float:
    others, wall = result.get("others_core_s"), result.get("phase_s") or 0.0
    return 0.0 if others is None or wall <= 0 else float(others) / float(wall)


def phase(label: str, quiet_wait: float = 0.0, below_cores: float = 0.25) -> CpuWatch:
    """Announce a phase and start watching the CPU; first, when ``quiet_wait`` > 0,
    wait up to that many seconds until other processes use less than ``below_cores``
    over a 1-second window."""
    started = time.perf_counter()
    while time.perf_counter() - started < quiet_wait:
        watch = CpuWatch()
        time.sleep(1.0)
        others = watch.stop()["others_core_s"]
        if others is None or others < below_cores:
            break
    waited = round(time.perf_counter() - started, 1) if quiet_wait > 0 else 0.0
    print(
        f"{label}..." + (f" (after {waited:.0f} s waiting for a quiet CPU)" if waited else ""),
        flush=True,
    )
    return CpuWatch(waited)

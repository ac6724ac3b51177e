"""How fast `calor ui` serves its pages over a channel of 10,000 memories: `make bench-ui`.

A fresh ``calor serve`` takes N short corpus memories (default 10,000) through one
``StoreStream``, answers 30 recalls (so memories carry recall jumps), dreams once and
fires an ``on_store`` trigger on the last 200 stores; a ``calor ui`` on it (its own
process) is then asked for each page, 3 times to warm up and 20 times measured:

- **html**: from the request to the last byte of the page (urllib, a new connection
  each time, as a browser's first visit);
- **browser** (when Debian's chromium and chromedriver are here): headless Chromium's
  own Navigation Timing from the start of the navigation to the end of the load event
  (the page's scripts have drawn the charts in view by then: the bench checks each
  page's drawn mark is there; sparklines further down a channel's page, and a memory's
  graph when it lies below the fold, are drawn as they are scrolled to). WebDriver's
  own round trips are not counted.

The channel page is asked for its first page and for the 41st (memories 4,000 to
4,099 by heat). The target: every page under 300 ms at p50 (DESIGN's inspector, issue
37). A table, and JSON in ``bench/results/ui-pages-<UTC stamp>.json``.

    .venv/bin/python bench/ui_pages.py [--memories 10000] [--loads 20]
"""

from __future__ import annotations

import argparse
import base64
import shutil
import statistics
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _server import Server, calor_command
from corpus import build_short_corpus
from throughput import machine_info, stream_store, write_results

from calor.client import CalorClient
from calor.server.cluster.local import free_port

CHANNEL = "ui-bench"
TARGET_MS = 300.0
WARMUPS = 3
RESULTS = Path(__file__).resolve().parent / "results"
Json = dict[str, Any]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memories", type=int, default=10_000)
    parser.add_argument("--loads", type=int, default=20)
    args = parser.parse_args()
    corpus = build_short_corpus(args.memories, 30)
    server = Server()
    try:
        server.wait_ready()
        setup = _fill(server, corpus.texts, corpus.queries)
        with _ui(server.port) as base:
            pages = _pages(base, setup)
            html = {name: _html_ms(url, args.loads) for name, url in pages.items()}
            browser = _browser_ms(pages, args.loads)
    finally:
        server.stop()
        server.close()
    report: Json = {
        "timestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": machine_info(),
        "memories": args.memories,
        "loads": args.loads,
        "setup": setup["timing"],
        "target_ms": TARGET_MS,
        "pages": {
            name: {"url": url, "html_ms": html[name], "browser_ms": browser.get(name)}
            for name, url in pages.items()
        },
    }
    print(_table(report))
    print(f"\nwrote {write_results(report, RESULTS, 'ui-pages')}")


def _fill(server: Server, texts: list[str], queries: list[str]) -> Json:
    """The channel the pages show: memories, recalls, a dream, a trigger's firings."""
    client = CalorClient(f"127.0.0.1:{server.port}", channel=CHANNEL, timeout=600)
    try:
        stored = stream_store(server.stub, CHANNEL, texts[:-200])
        client.create_trigger(event="on_store", action="notify", trigger_id="bench-notes")
        stream_store(server.stub, CHANNEL, texts[-200:])
        recalled = [hit.memory.id for q in queries for hit in client.recall(q, limit=10).hits]
        started = time.perf_counter()
        client.dream()
        dreamt = time.perf_counter() - started
    finally:
        client.close()
    return {
        "memory": recalled[0],
        "timing": {"store_s": round(stored, 1), "dream_s": round(dreamt, 1)},
    }


@contextmanager
def _ui(port: int) -> Iterator[str]:
    ui_port = free_port()
    command = [calor_command(), "--target", f"127.0.0.1:{port}", "ui", "--port", str(ui_port)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{ui_port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(base + "/static/calor.css", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError("calor ui did not start") from None
                time.sleep(0.2)
        yield base
    finally:
        process.terminate()
        process.wait(timeout=20)


def _pages(base: str, setup: Json) -> dict[str, str]:
    later = base64.urlsafe_b64encode(b"h4000").decode()  # the 41st page by heat
    query = urllib.parse.urlencode({"channel": CHANNEL, "query": "what did I buy last week?"})
    return {
        "fleet": f"{base}/",
        "channel (first page)": f"{base}/channels/{CHANNEL}",
        "channel (41st page)": f"{base}/channels/{CHANNEL}?page={urllib.parse.quote(later)}",
        "memory": f"{base}/channels/{CHANNEL}/memories/{setup['memory']}",
        "recall playground": f"{base}/recall?{query}",
        "events": f"{base}/events",
    }


def _html_ms(url: str, loads: int) -> Json:
    def load() -> float:
        started = time.perf_counter()
        with urllib.request.urlopen(url, timeout=30) as answer:
            if answer.status != 200:
                raise RuntimeError(f"{url} answered {answer.status}")
            answer.read()
        return (time.perf_counter() - started) * 1000

    return _timed(load, loads)


def _timed(load: Callable[[], float], loads: int) -> Json:
    """``load``'s milliseconds (it measures itself) over ``loads`` runs after warm-ups."""
    for _ in range(WARMUPS):
        load()
    return _summary([load() for _ in range(loads)])


def _summary(times: list[float]) -> Json:
    ordered = sorted(times)
    return {
        "p50": round(statistics.median(ordered), 1),
        "p95": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 1),
        "max": round(ordered[-1], 1),
    }


_LOAD_EVENT_END = "return performance.getEntriesByType('navigation')[0].loadEventEnd;"
_DRAWN = {  # what each page sets once its pictures are drawn
    "channel (first page)": "#memories[data-sparklines]",
    "channel (41st page)": "#memories[data-sparklines]",
    "memory": "#heat-curve[data-drawn]",
}


def _browser_ms(pages: dict[str, str], loads: int) -> dict[str, Json]:
    chromium = shutil.which("chromium")
    driver_path = shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        print("no chromium/chromedriver here: browser times left out", file=sys.stderr)
        return {}
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    options = Options()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,900"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    found: dict[str, Json] = {}
    try:
        for name, url in pages.items():
            drawn = _DRAWN.get(name)

            def load(url: str = url, drawn: str | None = drawn) -> float:
                driver.get(url)  # returns once the load event has run
                if drawn is not None and not driver.find_elements(By.CSS_SELECTOR, drawn):
                    raise RuntimeError(f"{url}: its pictures were not drawn by the load event")
                return float(driver.execute_script(_LOAD_EVENT_END))

            found[name] = _timed(load, loads)
    finally:
        driver.quit()
    return found


def _table(report: Json) -> str:
    machine = report["machine"]
    flags = ", ".join(name for name, on in machine["cpu_flags"].items() if on) or "none"
    lines = [
        f"calor ui page loads over {report['memories']:,} memories "
        f"({report['loads']} loads each after {WARMUPS} warm-ups)",
        f"CPU: {machine['cpu']} ({machine['nproc']} cores; {flags})",
        "",
        f"{'page':<24}{'html p50':>10}{'p95':>8}{'browser p50':>13}{'p95':>8}  under 300 ms",
    ]
    for name, page in report["pages"].items():
        html, browser = page["html_ms"], page["browser_ms"]
        worst = max(html["p50"], browser["p50"] if browser else 0.0)
        shown = f"{browser['p50']:>13.1f}{browser['p95']:>8.1f}" if browser else f"{'—':>13}{'':>8}"
        verdict = "yes" if worst < TARGET_MS else "NO"
        lines.append(f"{name:<24}{html['p50']:>10.1f}{html['p95']:>8.1f}{shown}  {verdict}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()

"""What ``min_band`` costs and gains on LongMemEval: gold and noise per confidence band.

Every recall hit carries a confidence band (``high``, ``mid``, ``low``), and
``RecallRequest.min_band`` leaves out hits below one. This measures, for an agent that
recalls 10 memories, what each setting ("" keeps all, "mid", "high") returns of the
answer-bearing turns (gold: the ``has_answer`` turns of the evidence sessions, as
``scoring.py`` defines them) and of the rest.

Each question's haystack goes into its own channel of a real ``calor serve``
(``_server.py``), exactly as ``quality.py`` stores it under the chosen protocol (one
memory per turn through one ``StoreStream``; ``bare``: text and ``created_at`` only;
``metadata``: also episodic, a ``session`` counter tag and a source; never a session id
nor an answer flag). Then the question is asked through the real stubs three times,
``Recall(limit=10, peek=True)`` with ``min_band`` "", "mid" and "high" (``as_of`` the
question's date under ``metadata`` only, and ``include_archived=True``, both as
``quality.py`` does), plus once more with "" and ``include_archived=False`` (the MCP
tool's default), only to count what that leaves: the haystacks are dated 2023, so by
now the service has aged many of their memories out of the default search, which an
agent's fresh memories would not be; bands do not depend on heat or age.

The server applies ``min_band`` before it cuts to ``limit``, so a banded recall can
return hits ranked below the unbanded top 10 ("backfill"); the tables count both what a
setting drops from the unbanded top 10 and what it brings in instead.

    .venv/bin/python bench/bands.py [--splits oracle,s] [--limit 60] [--oracle-limit N]
        [--oracle-protocols bare,metadata] [--s-protocols bare]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import longmemeval
from _server import Server
from longmemeval import Question
from quality import store_haystack
from throughput import machine_info, write_results

from calor.v1 import memory_service_pb2 as pb
from calor.v1 import memory_service_pb2_grpc as pb_grpc

Json = dict[str, Any]
LIMIT = 10
SETTINGS = ("", "mid", "high")
BANDS = ("high", "mid", "low")
DEFAULT_OUT = longmemeval.REPO / "bench" / "results"

# One hit as recorded: (turn index in the haystack, band, gold).
Hit = tuple[int, str, bool]


def _label(setting: str) -> str:
    return f'"{setting}"'


def ask(
    stub: pb_grpc.MemoryServiceStub,
    channel: str,
    question: Question,
    protocol: str,
    position: dict[str, int],
    min_band: str,
    include_archived: bool = True,
) -> list[Hit]:
    """The question's hits under ``min_band``, best first."""
    request = pb.RecallRequest(
        channel=channel,
        query=question.text,
        limit=LIMIT,
        peek=True,
        min_band=min_band,
        include_archived=include_archived,
    )
    moment = longmemeval.as_of(question, protocol)
    if moment is not None:
        request.as_of.FromDatetime(moment)
    reply = stub.Recall(request, timeout=60.0)
    hits = []
    for hit in reply.hits:
        turn = position[hit.memory.id]
        hits.append((turn, hit.band, turn in question.gold_turns))
    return hits


def run(questions: Sequence[Question], protocol: str) -> Json:
    """Every question stored and asked under each setting through one fresh server."""
    server = Server()
    records: list[Json] = []
    ingest_s = 0.0
    try:
        server.wait_ready()
        for number, question in enumerate(questions):
            channel = f"bands-{number}"
            started = time.perf_counter()
            ids = store_haystack(server.stub, channel, question, protocol)
            ingest_s += time.perf_counter() - started
            position = {memory_id: i for i, memory_id in enumerate(ids)}
            hits = {
                setting: ask(server.stub, channel, question, protocol, position, setting)
                for setting in SETTINGS
            }
            default = ask(server.stub, channel, question, protocol, position, "", False)
            records.append(
                {
                    "question_id": question.question_id,
                    "type": question.question_type,
                    "turns": len(question.turns),
                    "gold_turns": sorted(question.gold_turns),
                    "hits": {setting: [list(h) for h in found] for setting, found in hits.items()},
                    "hits_without_archived": len(default),
                }
            )
            if (number + 1) % 10 == 0 or number + 1 == len(questions):
                print(
                    f"  {protocol}: {number + 1}/{len(questions)} questions, "
                    f"ingest {ingest_s:.0f} s",
                    flush=True,
                )
        exit_code = server.stop()
    finally:
        server.close()
    return {"records": records, "ingest_s": round(ingest_s, 1), "exit_code": exit_code}


def band_table(records: Sequence[Json]) -> Json:
    """The unbanded top 10's hits by band: how many, their share, how many are gold."""
    hits = [hit for r in records for hit in r["hits"][""]]
    gold_total = sum(1 for _, _, gold in hits if gold)
    out: Json = {}
    for band in BANDS:
        mine = [gold for _, b, gold in hits if b == band]
        gold = sum(mine)
        out[band] = {
            "hits": len(mine),
            "share_of_hits": _pct(len(mine), len(hits)),
            "gold": gold,
            "gold_share": _pct(gold, len(mine)),
            "share_of_gold_hits": _pct(gold, gold_total),
        }
    out["all"] = {
        "hits": len(hits),
        "share_of_hits": 100.0,
        "gold": gold_total,
        "gold_share": _pct(gold_total, len(hits)),
        "share_of_gold_hits": 100.0,
    }
    return out


def setting_row(records: Sequence[Json], setting: str) -> Json:
    """What an agent gets under one setting, and how it differs from the unbanded top 10."""
    counts: list[int] = []
    gold_hits = any_found = all_found = zero = 0
    dropped = {"gold": 0, "noise": 0}
    added = {"gold": 0, "noise": 0}
    any_lost = zero_lost_gold = 0
    for r in records:
        got = {turn: gold for turn, _, gold in r["hits"][setting]}
        base = {turn: gold for turn, _, gold in r["hits"][""]}
        gold_got = sum(got.values())
        counts.append(len(got))
        gold_hits += gold_got
        any_found += gold_got > 0
        all_found += gold_got == len(r["gold_turns"])
        zero += not got
        for turn, gold in base.items():
            if turn not in got:
                dropped["gold" if gold else "noise"] += 1
        for turn, gold in got.items():
            if turn not in base:
                added["gold" if gold else "noise"] += 1
        had_gold = any(base.values())
        any_lost += had_gold and gold_got == 0
        zero_lost_gold += had_gold and not got
    n, returned = len(records), sum(counts)
    return {
        "questions": n,
        "mean_hits": round(returned / n, 2),
        "median_hits": statistics.median(counts),
        "hits": returned,
        "gold_hits": gold_hits,
        "precision": _pct(gold_hits, returned),
        "recall_any@10": _pct(any_found, n),
        "recall_all@10": _pct(all_found, n),
        "zero_hit_questions": zero,
        "zero_hit_questions_that_had_gold": zero_lost_gold,
        "questions_losing_all_gold": any_lost,
        "dropped_from_unbanded": dropped,
        "backfilled": added,
    }


def by_type(records: Sequence[Json]) -> Json:
    """recall_any@10 and zero-hit questions per question type and setting."""
    groups: dict[str, list[Json]] = defaultdict(list)
    for r in records:
        groups[r["type"]].append(r)
    out: Json = {}
    for name, rows in sorted(groups.items()):
        out[name] = {"questions": len(rows)}
        for setting in SETTINGS:
            row = setting_row(rows, setting)
            out[name][setting or "all"] = {
                k: row[k] for k in ("recall_any@10", "precision", "zero_hit_questions")
            }
    return out


def summarize(run_result: Json) -> Json:
    records = run_result["records"]
    return {
        "questions": len(records),
        "turns": sum(r["turns"] for r in records),
        "gold_turns": sum(len(r["gold_turns"]) for r in records),
        "ingest_s": run_result["ingest_s"],
        "exit_code": run_result["exit_code"],
        "mean_hits_without_archived": round(
            sum(r["hits_without_archived"] for r in records) / len(records), 2
        ),
        "bands": band_table(records),
        "settings": {setting or "all": setting_row(records, setting) for setting in SETTINGS},
        "by_type": by_type(records),
        "records": records,
    }


def _pct(part: float, whole: float) -> float:
    return round(100.0 * part / whole, 1) if whole else 0.0


def render_one(name: str, result: Json) -> list[str]:
    lines = [
        "",
        f"### {name}: {result['questions']} questions, {result['turns']} turns, "
        f"{result['gold_turns']} gold turns (ingest {result['ingest_s']:.0f} s; "
        f"mean hits with include_archived=False: {result['mean_hits_without_archived']})",
        "",
        "Hits of the unbanded top 10, by band:",
        "",
        "| band | hits | share of hits | gold hits | gold share of band | share of all gold hits |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for band, row in result["bands"].items():
        lines.append(
            f"| {band} | {row['hits']} | {row['share_of_hits']:.1f} % | {row['gold']} | "
            f"{row['gold_share']:.1f} % | {row['share_of_gold_hits']:.1f} % |"
        )
    lines += [
        "",
        "Per setting (limit 10, as the server answers it):",
        "",
        "| min_band | mean hits/q | median | precision | recall_any@10 | recall_all@10 "
        "| zero-hit q (had gold) | q losing all gold | dropped gold / noise "
        "| backfilled gold / noise |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for setting in SETTINGS:
        row = result["settings"][setting or "all"]
        d, b = row["dropped_from_unbanded"], row["backfilled"]
        lines.append(
            f"| {_label(setting)} | {row['mean_hits']:.2f} | {row['median_hits']:g} | "
            f"{row['precision']:.1f} % | {row['recall_any@10']:.1f} % | "
            f"{row['recall_all@10']:.1f} % | {row['zero_hit_questions']} "
            f"({row['zero_hit_questions_that_had_gold']}) | {row['questions_losing_all_gold']} | "
            f"{d['gold']} / {d['noise']} | {b['gold']} / {b['noise']} |"
        )
    lines += [
        "",
        'recall_any@10 by question type ("" / mid / high), zero-hit questions under mid:',
        "",
        '| type | q | any@10 "" | any@10 mid | any@10 high | zero-hit q mid |',
        "|---|---:|---:|---:|---:|---:|",
    ]
    for kind, row in result["by_type"].items():
        lines.append(
            f"| {kind} | {row['questions']} | {row['all']['recall_any@10']:.1f} | "
            f"{row['mid']['recall_any@10']:.1f} | {row['high']['recall_any@10']:.1f} | "
            f"{row['mid']['zero_hit_questions']} |"
        )
    return lines


def render(report: Json) -> str:
    machine = report["machine"]
    lines = [
        f"## Confidence bands on LongMemEval (commit {machine['git_commit']}"
        f"{'+dirty' if machine['git_dirty'] else ''}, {report['timestamp']}, "
        f"CPU {machine['cpu']}, {machine['nproc']} CPUs)",
        "",
        "gold = has_answer turn of an evidence session; precision = gold share of returned "
        "hits; dropped = hits of the unbanded top 10 the setting leaves out; backfilled = "
        "hits the setting returns that the unbanded top 10 did not hold.",
    ]
    for name, result in report["runs"].items():
        lines += render_one(name, result)
    return "\n".join(lines)


def _names(text: str) -> list[str]:
    names = [p.strip() for p in text.split(",") if p.strip()]
    if not names or set(names) - set(longmemeval.PROTOCOLS):
        raise SystemExit(f"protocols: one or more of {', '.join(longmemeval.PROTOCOLS)}")
    return names


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--splits", default="oracle,s", help="comma-separated: oracle, s")
    parser.add_argument("--limit", type=int, default=60, help="scored S questions")
    parser.add_argument("--oracle-limit", type=int, default=None, help="oracle questions (all)")
    parser.add_argument("--oracle-protocols", default="bare,metadata")
    parser.add_argument("--s-protocols", default="bare")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    splits = [s.strip() for s in args.splits.split(",") if s.strip()]
    if not splits or set(splits) - {"oracle", "s"}:
        parser.error("--splits: one or more of oracle, s")
    plan = {
        "oracle": (args.oracle_limit, _names(args.oracle_protocols)),
        "s": (args.limit, _names(args.s_protocols)),
    }
    started = time.perf_counter()
    report: Json = {
        "timestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": machine_info(),
        "limit": LIMIT,
        "runs": {},
    }
    print(f"CPU {report['machine']['cpu']}, {report['machine']['nproc']} CPUs", flush=True)
    for split in splits:
        limit, protocols = plan[split]
        questions = longmemeval.load(split, limit)
        print(f"{split}: {len(questions)} questions", flush=True)
        for protocol in protocols:
            report["runs"][f"{split}/{protocol}"] = summarize(run(questions, protocol))
    report["seconds"] = round(time.perf_counter() - started, 1)
    table = render(report)
    print("\n" + table + f"\n\nwhole run: {report['seconds'] / 60:.1f} min")
    report["table"] = table
    print(f"wrote {write_results(report, args.out, name='bands')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

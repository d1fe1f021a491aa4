"""Replays issued during the run, through the real CLI, as on-call would:
an event replay by window (`events replay --since --until`) and a bulk
replay of the open dead letters (`dlq replay --all`). Both run things
again by design (docs/reference.md §8), so they are counted, not forgiven
(only a repeat a recorded `prune` explains is, as for the event's own key):

- an event replay runs each event of its frozen selection once more under
  `replay-R/KEY` (each route's: `replay-R/KEY#ROUTE`): every item has one
  `ctx.db` effect and one successful call under that key, or one open dead
  letter when the event is told to fail for good; the event's own key is
  untouched; the selection is one item per key archived in the window
  (never a `conflict` or `ignored` arrival);
- a dead-letter replay runs the key again from attempt 1: an event told to
  fail "until replayed" (PermanentError unless `event.replay` names a
  dead-letter replay) then completes, once; one dead-lettered before the
  bulk replay read the list and still open after it was missed.
"""

import asyncio
import json
import os
import random
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime

import asyncpg

from tests.chaos.checks import judge_completed_and_dead, prune_times, repeats_unexplained
from tests.chaos.plan import Fault, PlannedEvent

WINDOW_LAG = 2.0  # seconds: an event replay's window ends this long before it is issued
WINDOW_SECONDS = (2.0, 4.0)
REPLAY_RATE = "100"  # events a second
MISSED_MARGIN = 1.0  # seconds: a dead letter older than the bulk replay by this much was surely listed


def draw(rng: random.Random, duration: float) -> list[Fault]:
    """One event replay by window, mid-run, and one dead-letter bulk replay, later."""
    return [
        Fault(rng.uniform(0.3, 0.6) * duration, "replay", seconds=rng.uniform(*WINDOW_SECONDS)),
        Fault(rng.uniform(0.6, 0.85) * duration, "dlq-replay"),
    ]


@dataclass
class IssuedReplay:
    kind: str  # "events" or "dead letters"
    started: float  # wall clock when the command started
    ended: float
    exit_code: int
    output: str
    replay_id: int | None = None  # an event replay's R
    since: datetime | None = None
    until: datetime | None = None
    dead_letter_ids: list[int] = field(default_factory=list)  # what a bulk replay says it replayed


async def events_replay(env: dict[str, str], source: str, window: float) -> IssuedReplay:
    now = datetime.now(UTC).timestamp()
    # in whole milliseconds, as the command is given them: the window judged is the one asked for (an
    # arrival stamped at `until`'s millisecond is outside it, and was counted in when `until` kept its µs)
    since, until = (
        datetime.fromtimestamp(round(now - WINDOW_LAG - window, 3), UTC),
        datetime.fromtimestamp(round(now - WINDOW_LAG, 3), UTC),
    )
    issued = await _cli(
        env,
        "events",
        "replay",
        "--source",
        source,
        "--since",
        _iso(since),
        "--until",
        _iso(until),
        "--rate",
        REPLAY_RATE,
        "--yes",
        "--json",
        kind="events",
    )
    issued.since, issued.until = since, until
    try:
        issued.replay_id = int(json.loads(issued.output.strip().splitlines()[-1])["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        pass
    return issued


async def dead_letter_replay(env: dict[str, str], source: str) -> IssuedReplay:
    issued = await _cli(env, "dlq", "replay", "--all", "--source", source, kind="dead letters")
    for line in issued.output.splitlines():
        if line.startswith("replayed ") and ":" in line:
            issued.dead_letter_ids = [int(n) for n in line.split(":", 1)[1].split(",") if n.strip().isdigit()]
    return issued


def _iso(moment: datetime) -> str:
    return moment.replace(tzinfo=None).isoformat(timespec="milliseconds")


async def _cli(env: dict[str, str], *arguments: str, kind: str) -> IssuedReplay:
    started = datetime.now(UTC).timestamp()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "webhook_ingest",
        *arguments,
        env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT if kind != "events" else asyncio.subprocess.PIPE,
    )
    stdout, stderr = await process.communicate()
    text = stdout.decode(errors="replace")
    if kind == "events" and process.returncode:
        text += stderr.decode(errors="replace")
    return IssuedReplay(kind, started, datetime.now(UTC).timestamp(), process.returncode or 0, text)


# -- judging -------------------------------------------------------------------


@dataclass
class ReplaysSeen:
    """What Postgres shows of the replays."""

    states: dict[int, tuple[str, int, int, int]] = field(
        default_factory=dict
    )  # R -> (state, total, published, skipped)
    items: dict[int, list[str]] = field(default_factory=lambda: defaultdict(list))  # R -> its items' keys
    window_keys: dict[int, set[str]] = field(default_factory=dict)  # R -> keys archived in its window
    window_conflicts: dict[int, set[str]] = field(default_factory=dict)  # R -> keys with only a conflict there
    replayed_keys: set[str] = field(default_factory=set)  # keys with a dead letter of status `replayed`
    dead_created: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))  # open ones' created_at


async def observe(database_url: str, issued: list[IssuedReplay], source: str) -> ReplaysSeen:
    seen = ReplaysSeen()
    connection = await asyncpg.connect(database_url)
    try:
        for replay in (each for each in issued if each.replay_id is not None):
            row = await connection.fetchrow(
                "SELECT state, total, published, skipped FROM event_replays WHERE id = $1", replay.replay_id
            )
            if row is not None:
                seen.states[replay.replay_id] = (row["state"], row["total"], row["published"], row["skipped"])
            seen.items[replay.replay_id] = [
                r["key"]
                for r in await connection.fetch(
                    "SELECT key FROM event_replay_items WHERE replay_id = $1 ORDER BY item", replay.replay_id
                )
            ]
            window = await connection.fetch(
                "SELECT DISTINCT key, status IN ('conflict', 'ignored') AS never_ran FROM event_archive"
                " WHERE source = $1 AND received_at >= $2 AND received_at < $3",
                source,
                replay.since,
                replay.until,
            )
            seen.window_keys[replay.replay_id] = {r["key"] for r in window if not r["never_ran"]}
            # an arrival `queued` when the selection was frozen may be found a conflict after: either way
            seen.window_conflicts[replay.replay_id] = {r["key"] for r in window if r["never_ran"]}
        seen.replayed_keys = {
            r["key"] for r in await connection.fetch("SELECT DISTINCT key FROM dead_letters WHERE status = 'replayed'")
        }
        for row in await connection.fetch(
            "SELECT key, extract(epoch FROM created_at) AS at FROM dead_letters WHERE status = 'dead'"
        ):
            seen.dead_created[row["key"]].append(float(row["at"]))
    finally:
        await connection.close()
    return seen


def judge_until_replayed(key: str, replays: ReplaysSeen, issued: list[IssuedReplay], verdict) -> None:
    """An event told to fail until a dead-letter replay runs it is left dead
    only when no bulk replay came after its dead letter (checks.py judges
    the rest: completed only once a dead letter of it was replayed)."""
    bulk = [each.started for each in issued if each.kind == "dead letters" and each.exit_code == 0]
    for created in replays.dead_created.get(key, []):
        if any(created + MISSED_MARGIN < started for started in bulk):
            verdict.violate(
                "missed by the bulk replay",
                f"{key}: dead-lettered before `dlq replay --all` started, still open after it",
            )


def judge_event_replays(
    events: list[PlannedEvent],
    sent,
    seen,
    replays: ReplaysSeen,
    issued: list[IssuedReplay],
    routes: tuple[str, ...],
    verdict,
    judge_runs,
    prunes: list[tuple[float, float]],
) -> Counter:
    """Every item of every event replay ran once more under its replay key;
    returns the replayed runs per replay, for the report."""
    by_key = {sent.accepted[event.event_id]: event for event in events if event.event_id in sent.accepted}
    ran: Counter = Counter()
    for replay in issued:
        if replay.kind != "events":
            continue
        if replay.exit_code or replay.replay_id is None:
            verdict.violate("replay failed", f"events replay exited {replay.exit_code}: {replay.output[-300:]!r}")
            continue
        rid = replay.replay_id
        state = replays.states.get(rid)
        items = replays.items.get(rid, [])
        if state is None or state[0] != "done" or state[2] + state[3] != state[1] or state[3]:
            verdict.violate("replay not done", f"replay {rid}: (state, total, published, skipped) = {state}")
        must, may = replays.window_keys.get(rid, set()), replays.window_conflicts.get(rid, set())
        if not must <= set(items) <= must | may or len(items) != len(set(items)):
            verdict.violate(
                "replay selection wrong",
                f"replay {rid}: {len(items)} items, {len(must)} keys "
                f"archived in its window; missing {sorted(must - set(items))[:5]}, "
                f"extra {sorted(set(items) - must - may)[:5]}",
            )
        for key in items:
            event = by_key.get(key)
            for each in [f"{key}#{route}" for route in routes] if routes else [key]:
                replayed = f"replay-{rid}/{each}"
                ran[rid] += 1
                _judge_replayed(event, replayed, seen, replays, verdict, prunes)
                judge_runs(replayed)
    return ran


def _judge_replayed(event: PlannedEvent | None, key: str, seen, replays: ReplaysSeen, verdict, prunes) -> None:
    """A replay key is a key like any (docs/reference.md §8, "Exactly once per
    replay": the workers' usual steps), so a copy after `prune` forgot its
    completion runs again (§2), as tests/chaos/checks.py allows for the event's own key."""
    effects, dead = sorted(seen.effects.get(key, [])), seen.open_dead_letters.get(key, [])
    fails = event.fail if event is not None else ""
    told_to_die = fails in ("permanent", "always") or (fails == "until_replayed" and key not in replays.replayed_keys)
    repeats = repeats_unexplained(effects, prunes)
    verdict.outcomes["replay repeated after prune (allowed)"] += max(len(effects) - 1 - repeats, 0)
    if not effects and not dead:
        verdict.violate("replay lost", f"{key}: an item of the replay, with no effect and no dead letter")
    elif repeats:
        verdict.violate(
            "replay ran twice",
            f"{key}: {len(effects)} effects in the completion transaction (begun "
            f"{', '.join(_clock(begun) for _, begun in effects)}); prunes {prune_times(prunes)}",
        )
    elif effects and dead:
        judge_completed_and_dead(key, fails, effects, dead, seen.open_dead_at[key], prunes, verdict)
    elif dead and not told_to_die:
        verdict.violate("false dead letter", f"{key}: dead-lettered ({dead[-1]}), fail={fails or 'none'}")
    elif effects and told_to_die:
        verdict.violate("missing dead letter", f"{key}: completed although told to fail ({fails})")
    else:
        verdict.outcomes["replayed once, as told"] += 1


def _clock(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).strftime("%H:%M:%S.%f")[:-3]


def report_lines(issued: list[IssuedReplay], seen: ReplaysSeen) -> list[str]:
    lines = []
    for replay in issued:
        if replay.kind == "events":
            state = seen.states.get(replay.replay_id or 0)
            told = (
                f"{state[1]} events frozen, {state[2]} published, {state[0]}" if state else f"exit {replay.exit_code}"
            )
            lines.append(
                f"replays    events replay {replay.replay_id} (window {_iso(replay.since)}–"
                f"{_iso(replay.until)}): {told}"
            )
        else:
            lines.append(
                f"replays    dlq replay --all: {len(replay.dead_letter_ids)} dead letters put back"
                + (f" (exit {replay.exit_code})" if replay.exit_code else "")
            )
    return lines

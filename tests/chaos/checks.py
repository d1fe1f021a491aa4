"""The end-of-run verdict: what Postgres and the broker show for every
event the plan sent, against docs/reference.md §6–§8. Each violation names its key.

- an accepted key has exactly one effect (an inbox row and one
  `chaos_effects` row) and no open dead letter, or exactly one open dead
  letter and no effect; a dead letter exactly when the handler was told to
  fail for good;
- no two runs of one key overlap, and none starts after the key's effect
  was written (`chaos_runs` intervals);
- a key accepted with two payloads has its conflict in `event_conflicts`;
- a lone surrogate escape is refused with 400, a valid body never is;
- no queue of the namespace holds a message once the workers are stopped;
- the event archive (docs/reference.md §9) holds one row per 200 the sender
  got for a key (the event, its copies, its conflicts), none left `queued`
  or `retrying`, with the final status of what became of the event: as many
  `processed` rows as arrivals that ran (an arrival run again after `prune`
  is one row for two effects) and a `dead` row for an open dead letter (with
  routes, the event's one row shows its routes' runs: only its rows are counted).

A repeat after `prune` is allowed: a completion record pruned (the window
had passed when prune ran) is forgotten by design, and docs/reference.md §2 says a later
copy runs again. So is its other face: an event told to fail until a
dead-letter replay runs it, completed by that replay, then a copy after a
prune forgot the completion, run as a plain run and dead-lettered as told.
"""

import asyncio
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import pairwise

import asyncpg

from tests.chaos.plan import PlannedEvent
from tests.chaos.traffic import Sent

PRUNE_WINDOW_SECONDS = 1.0
STOPPED_SLACK_SECONDS = 1.0  # as tests/chaos/reruns.py's PAUSE_SLACK_SECONDS


@dataclass
class Observed:
    """What the database shows, per key."""

    effects: dict[str, list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))  # (at, txn start)
    effect_arrivals: dict[str, set[int]] = field(default_factory=lambda: defaultdict(set))  # key -> receive ms that ran
    runs: dict[str, list[tuple[float, float | None, int]]] = field(default_factory=lambda: defaultdict(list))
    inbox: set[str] = field(default_factory=set)
    completions: set[str] = field(default_factory=set)
    open_dead_letters: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))  # key -> last errors
    open_dead_at: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))  # key -> created_at
    conflicts: set[str] = field(default_factory=set)
    archive: dict[str, Counter] | None = None  # key -> its archived rows by status; None: no archive table
    recorder: bool = True  # the chaos handler's tables exist (always in a local run)
    workers: dict[int, str] = field(default_factory=dict)  # pid -> which worker (a local run knows)
    replayed: set[str] = field(default_factory=set)  # keys with a dead letter a replay put back (status replayed)
    stopped: dict[int, list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))  # pid -> pauses

    def stopped_at(self, pid: int, moment: float) -> bool:
        """Process `pid` stopped (SIGSTOP) at `moment`, or continued too
        shortly before to have heard that its lease lapsed meanwhile."""
        return any(begun <= moment <= ended + STOPPED_SLACK_SECONDS for begun, ended in self.stopped.get(pid, ()))

    def who(self, pid: int) -> str:
        return f"pid {pid} ({self.workers[pid]})" if pid in self.workers else f"pid {pid}"


@dataclass
class Verdict:
    outcomes: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    violations: list[tuple[str, str]] = field(default_factory=list)  # (kind, detail with the key)

    def violate(self, kind: str, detail: str) -> None:
        self.violations.append((kind, detail))


async def observe(database_url: str, key_pattern: str = "%") -> Observed:
    """The rows of the keys matching `key_pattern` (SQL LIKE): only this run's, in a shared database."""
    connection = await connect(database_url)
    try:
        return await _observe(connection, key_pattern)
    finally:
        await connection.close()


async def connect(database_url: str, tries: int = 120) -> asyncpg.Connection:
    """A connection, waiting while a Postgres shared with other work has no
    slot left (TooManyConnectionsError), two minutes at most: the verdict is on the run, not its host."""
    for _ in range(tries - 1):
        try:
            return await asyncpg.connect(database_url)
        except asyncpg.TooManyConnectionsError:
            await asyncio.sleep(1.0)
    return await asyncpg.connect(database_url)


async def _observe(connection, pattern: str) -> Observed:
    seen = Observed()
    seen.recorder = await connection.fetchval(  # this run's handler is the recorder: it left intervals
        "SELECT to_regclass('chaos_runs') IS NOT NULL"
    ) and await connection.fetchval("SELECT EXISTS (SELECT 1 FROM chaos_runs WHERE key LIKE $1)", pattern)
    if seen.recorder:
        for row in await connection.fetch(
            "SELECT key, extract(epoch FROM at) AS at, extract(epoch FROM transaction_started) AS t, received_ms"
            " FROM chaos_effects WHERE key LIKE $1",
            pattern,
        ):
            seen.effects[row["key"]].append((float(row["at"]), float(row["t"])))
            if row["received_ms"] is not None:
                seen.effect_arrivals[row["key"]].add(row["received_ms"])
        for row in await connection.fetch(
            "SELECT key, pid, extract(epoch FROM started) AS s, extract(epoch FROM ended) AS e"
            " FROM chaos_runs WHERE key LIKE $1",
            pattern,
        ):
            seen.runs[row["key"]].append((float(row["s"]), None if row["e"] is None else float(row["e"]), row["pid"]))
    if await connection.fetchval("SELECT to_regclass('inbox') IS NOT NULL"):
        seen.inbox = await _keys(connection, "SELECT key FROM inbox WHERE key LIKE $1", pattern)
    seen.completions = await _keys(connection, "SELECT key FROM processed_events WHERE key LIKE $1", pattern)
    for row in await connection.fetch(
        "SELECT key, errors -> -1 ->> 'type' AS last, extract(epoch FROM created_at) AS at FROM dead_letters"
        " WHERE status = 'dead' AND key LIKE $1 ORDER BY id",
        pattern,
    ):
        seen.open_dead_letters[row["key"]].append(row["last"] or "?")
        seen.open_dead_at[row["key"]].append(float(row["at"]))
    seen.conflicts = await _keys(connection, "SELECT DISTINCT key FROM event_conflicts WHERE key LIKE $1", pattern)
    seen.replayed = await _keys(
        connection, "SELECT DISTINCT key FROM dead_letters WHERE status = 'replayed' AND key LIKE $1", pattern
    )
    if await connection.fetchval("SELECT to_regclass('event_archive') IS NOT NULL"):
        seen.archive = defaultdict(Counter)
        for row in await connection.fetch(
            "SELECT key, status, count(*) AS n FROM event_archive WHERE key LIKE $1 GROUP BY key, status", pattern
        ):
            seen.archive[row["key"]][row["status"]] = row["n"]
    return seen


async def _keys(connection, sql: str, pattern: str) -> set[str]:
    return {row["key"] for row in await connection.fetch(sql, pattern)}


def resolved(sent: Sent, seen: Observed, routes: tuple[str, ...] = ()) -> int:
    """Accepted keys (each route's, with routes) that have an effect (or a
    completion) or an open dead letter: the drain's progress."""
    done = seen.inbox | seen.completions | set(seen.effects) | set(seen.open_dead_letters)
    return sum(1 for key in set(sent.accepted.values()) for each in run_keys(key, routes) if each in done)


def run_keys(key: str, routes: tuple[str, ...]) -> list[str]:
    """The keys an accepted event runs under: its own, or one per route
    (KEY#ROUTE, docs/reference.md §5), each judged as an event of its own."""
    return [f"{key}#{route}" for route in routes] if routes else [key]


def judge(
    events: list[PlannedEvent],
    sent: Sent,
    seen: Observed,
    prunes: list[tuple[float, float]],
    leftover: dict[str, int],
    routes: tuple[str, ...] = (),
    left: dict[str, list[tuple[str, str]]] | None = None,
) -> Verdict:
    """`left`: a few of each queue's leftover messages, (key, headers), to name them."""
    verdict = Verdict()
    for event in events:
        _judge_answers(event, sent, verdict)
        key = sent.accepted.get(event.event_id)
        for each in run_keys(key, routes) if key is not None else []:
            _judge_key(event, each, sent, seen, prunes, verdict)
        if key is not None and seen.archive is not None:
            _judge_archive(event, key, sent, seen, routes, verdict)
    for queue, count in sorted(leftover.items()):
        if count:
            named = "".join(
                f"; {key} ({_recorded(key, seen)}): {headers}" for key, headers in (left or {}).get(queue, [])
            )
            verdict.violate("left in a queue", f"{count} message(s) in {queue} after the workers stopped{named}")
    return verdict


def _recorded(key: str, seen: Observed) -> str:
    """What Postgres holds of a leftover message's key: is it a copy of something settled?"""
    if key in seen.completions or key in seen.effects:
        return "completed"
    return "open dead letter" if key in seen.open_dead_letters else "neither completed nor dead-lettered"


def _judge_answers(event: PlannedEvent, sent: Sent, verdict: Verdict) -> None:
    answers = sent.answers.get(event.event_id, {})
    if event.must_be_refused:
        verdict.outcomes["refused at the door"] += answers.get("400 invalid_json", 0)
        if any(answer.startswith("200") for answer in answers):
            verdict.violate(
                "unstorable body accepted",
                f"{event.event_id}: a lone surrogate escape got 200, docs/reference.md §6 wants 400 invalid_json",
            )
        return
    for answer, count in answers.items():
        if not answer.startswith("200"):
            verdict.violate("valid body not accepted", f"{event.event_id} ({event.kind}): {count} x {answer}")


def _judge_key(event, key: str, sent: Sent, seen: Observed, prunes, verdict: Verdict) -> None:
    if not seen.recorder:
        return _judge_contract_tables(event, key, seen, verdict)
    effects, dead = sorted(seen.effects.get(key, [])), seen.open_dead_letters.get(key, [])
    # told to fail until a dead-letter replay runs it (tests/chaos/replays.py): once one did, it completes
    expect_dead = event.expect_dead_letter and not (event.fail == "until_replayed" and key in seen.replayed)
    repeats = repeats_unexplained(effects, prunes)
    verdict.outcomes["repeated after prune (allowed)"] += len(effects) - 1 - repeats if effects else 0
    if not effects and not dead:
        verdict.violate("lost", f"{key}: accepted, but no effect and no dead letter")
    elif effects and dead:
        judge_completed_and_dead(key, event.fail, effects, dead, seen.open_dead_at[key], prunes, verdict)
    elif len(dead) > 1:
        verdict.violate("several open dead letters", f"{key}: {len(dead)} open dead letters")
    elif dead and not expect_dead:
        verdict.violate("false dead letter", f"{key}: dead-lettered ({dead[-1]}), fail={event.fail or 'none'}")
    elif effects and expect_dead:
        verdict.violate("missing dead letter", f"{key}: completed although told to fail ({event.fail})")
    elif effects and event.fail == "until_replayed":
        verdict.outcomes["completed once, after its dead letter's replay"] += 1
    else:
        verdict.outcomes["dead letter, as told" if dead else "completed once"] += 1
    if repeats:
        verdict.violate("effect repeated", f"{key}: {len(effects)} effects in the completion transaction")
    if effects and key not in seen.inbox:
        verdict.violate("effect without inbox row", f"{key}: the inbox insert did not commit with the effect")
    judge_runs(key, seen, effects[:1], prunes, verdict)
    _judge_conflict(event, key, sent, seen, len(effects) == 1, verdict)


ARCHIVE_VIOLATIONS = ("not archived", "archive copies miscounted", "archive not settled", "archive status wrong")
FINAL = ("processed", "dead", "discarded", "conflict", "duplicate")  # what a settled arrival's row shows


def _judge_archive(event, key: str, sent: Sent, seen: Observed, routes: tuple[str, ...], verdict: Verdict) -> None:
    """Every 200 is an archived arrival of the key, settled to what became of the event."""
    rows, accepted = (
        seen.archive.get(key, Counter()),
        sum(count for answer, count in sent.answers.get(event.event_id, {}).items() if answer.startswith("200")),
    )
    if not rows:
        return verdict.violate("not archived", f"{key}: {accepted} x 200, no row in event_archive")
    if sum(rows.values()) != accepted:
        verdict.violate("archive copies miscounted", f"{key}: {accepted} x 200, {_statuses(rows)} archived")
    if unsettled := {status: n for status, n in rows.items() if status not in FINAL}:
        verdict.violate("archive not settled", f"{key}: {_statuses(unsettled)} left among {_statuses(rows)}")
    if routes:
        return None
    effects, dead = len(seen.effects.get(key, [])), len(seen.open_dead_letters.get(key, []))
    if not seen.recorder:
        effects = int(key in seen.completions or key in seen.inbox)
    # One row per arrival: an arrival whose message ran again after a prune is one `processed` row for two
    # effects. So as many `processed` as arrivals that ran (their receive times; two of one millisecond
    # that both ran count once), at most one per effect.
    ran = len(seen.effect_arrivals.get(key, ())) or effects
    if not ran <= rows["processed"] <= effects or min(rows["dead"], 1) != min(dead, 1):
        verdict.violate(
            "archive status wrong",
            f"{key}: {effects} effect(s), {dead} open dead letter(s), archived {_statuses(rows)}",
        )
    else:
        verdict.outcomes["archived as it ended"] += 1
    return None


def _statuses(rows) -> str:
    return ", ".join(f"{n} {status}" for status, n in sorted(rows.items()))


def _judge_contract_tables(event, key: str, seen: Observed, verdict: Verdict) -> None:
    """Without the chaos handler (a staging deployment's own handler): the tables docs/reference.md §9 names."""
    done, dead = key in seen.completions or key in seen.inbox, seen.open_dead_letters.get(key, [])
    if not done and not dead:
        verdict.violate("lost", f"{key}: accepted, but no completion record and no dead letter")
    elif done and dead:
        verdict.violate("completed and dead-lettered", f"{key}: completion and open dead letter ({dead[-1]})")
    elif len(dead) > 1:
        verdict.violate("several open dead letters", f"{key}: {len(dead)} open dead letters")
    else:
        verdict.outcomes["dead letter" if dead else "completed"] += 1


def judge_runs(key: str, seen: Observed, first_effect: list[tuple[float, float]], prunes, verdict: Verdict) -> None:
    """Intervals sorted by start: one starting before an earlier one ended ran at the same time."""
    latest_end, latest_pid = None, None
    for started, ended, pid in sorted(seen.runs.get(key, []), key=lambda run: run[0]):
        if latest_end is not None and started < latest_end and seen.stopped_at(latest_pid, started):
            verdict.outcomes["took over from a stopped holder"] += 1  # its lease lapsed; a call would show
        elif latest_end is not None and started < latest_end:
            verdict.violate(
                "two runs at once",
                f"{key}: {seen.who(pid)} started {latest_end - started:.3f}s before {seen.who(latest_pid)}'s run ended",
            )
        if first_effect and started > first_effect[0][0] and not _pruned_between(first_effect[0][1], started, prunes):
            verdict.violate(
                "ran after completion",
                f"{key}: {seen.who(pid)} started {started - first_effect[0][0]:.3f}s after the effect was written",
            )
        end = ended if ended is not None else started  # killed mid-run: only its start is known
        if latest_end is None or end > latest_end:
            latest_end, latest_pid = end, pid


def _judge_conflict(event, key: str, sent: Sent, seen: Observed, completed_once: bool, verdict: Verdict) -> None:
    """Completed more than once means a prune forgot the key (allowed above):
    the other payload then ran as a new event, with nothing to conflict with."""
    if sent.accepted_variants.get(event.event_id) == {0, 1} and completed_once:
        if key in seen.conflicts:
            verdict.outcomes["conflict recorded"] += 1
        else:
            verdict.violate("conflict not recorded", f"{key}: two payloads accepted, no event_conflicts row")


def repeats_unexplained(effects: list[tuple[float, float]], prunes: list[tuple[float, float]]) -> int:
    """The effects after the first that no prune between explains."""
    return sum(1 for before, after in pairwise(sorted(effects)) if not _pruned_between(before[1], after[0], prunes))


def dead_after_prune(
    effects: list[tuple[float, float]], dead_at: list[float], prunes: list[tuple[float, float]]
) -> bool:
    """Every open dead letter was made after the key's last effect, by a run
    a prune let in (the completion forgotten, a later copy ran as a plain run
    and failed for good, as its payload tells it to: docs/reference.md §2)."""
    at, completed_at = max(effects)
    return bool(dead_at) and all(made > at and _pruned_between(completed_at, made, prunes) for made in dead_at)


def judge_completed_and_dead(
    key: str, fail: str, effects, dead: list[str], dead_at: list[float], prunes, verdict
) -> None:
    """Both an effect and an open dead letter: allowed only for an event told
    to fail until a dead-letter replay runs it, dead-lettered after a prune."""
    if fail == "until_replayed" and dead_after_prune(effects, dead_at, prunes):
        verdict.outcomes["completed, then a copy dead-lettered after prune (allowed)"] += 1
    else:
        verdict.violate("completed and dead-lettered", f"{key}: effect and open dead letter ({dead[-1]})")


def prune_times(prunes: list[tuple[float, float]]) -> str:
    """Each prune's wall-clock start and end, for a violation's detail and the report."""
    return ", ".join(f"{_clock(started)}–{_clock(ended)}" for started, ended in prunes) or "none"


def _clock(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).strftime("%H:%M:%S.%f")[:-3]


def _pruned_between(completed_at: float, later: float, prunes: list[tuple[float, float]]) -> bool:
    """A prune that may have deleted the completion (`completed_at` was past
    the window before that prune ended) started before `later`: given the
    benefit of the doubt, as the prune's own clock reading is not known."""
    return any(completed_at + PRUNE_WINDOW_SECONDS < ended and started < later for started, ended in prunes)

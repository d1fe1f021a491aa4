"""Re-runs, and which fault explains each.

**Successful external calls (judged).** docs/reference.md §7.2 promises
that one key's handler never runs at two workers at once nor after the
key completed; an external call is not in the completion's transaction,
so it is repeated exactly when a run that made it could not complete and
another run of the key came after: its worker killed, its Postgres cut
(its lease could not be kept, or its completion not written), or its
process stopped past the lease while another worker really took the key
(a copy ran meanwhile); or a `prune` forgot the key's completion. So two
successful calls of one key (the downstream's count, tests/chaos/downstream.py)
are a violation unless the record (tests/chaos/applied.py) shows one of
these between them; each explained one is counted under its cause. A
pause explains a repeat only when the other call's run started while the
caller it stopped held the key, by another process, and the stopped one
called before it woke or within the round trip that tells it, once woken,
that the key is no longer its own (PAUSE_SLACK_SECONDS, as long as a
loaded host may take): the limit docs/design.md states ("Exclusion":
a handler resumes on waking, its call may go out before the answer
comes). A stopped process that called later than that, while another ran
the key, is two runs at once. "While the caller held the key" is read
from the lease's take, not from the wake: the other run may begin later
than the slack after the wake when the woken caller's confirmation of its
lapsed lease is slow to land (up to a TTL on a loop waking with hundreds
of runs: docs/design.md, "A lock that cannot be kept") and the taker came
back to the key meanwhile (its copy deferred while the lease held). Then
the woken caller's log says so: it gave the key's lease up because
Postgres refused it (`lease_lost_handler_cancelled`, `lost=refused`:
another run had taken it), within that TTL, and a run of the key by
another process began between the pause's start and that refusal — the
take it was refused for. The same holds when the woken caller's own
later run made the other call (the taker deferred, the key came back to it).
A lease given up unanswered (`lost=unanswered`) explains nothing: no one had
taken the key.

**Handler re-runs (counted).** A run of an attempt that already ran (the
`chaos_runs` intervals: same key, same attempt number) is a re-run; each
is set beside the fault that touched the earlier run's process between the
two runs' starts, or counted as none (a copy deferred, a redelivery). A
dead-letter replay starts a key's attempts again at 1: such runs are counted
under it. Event replays run under keys of their own (tests/chaos/replays.py).
"""

import contextlib
import itertools
import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import asyncpg

from tests.chaos.applied import Applied
from tests.chaos.downstream import Call

PRUNE_WINDOW_SECONDS = 1.0
# A key whose lease lapsed during a pause may be taken just after its holder woke, before the
# holder's confirmation came back "not ours": the taker's run starts this long after the pause at most.
PAUSE_SLACK_SECONDS = 1.0
CAUSES = ("kill", "pause", "cut postgres", "cut rabbitmq", "cut redis", "hog", "flush", "prune")


@dataclass(frozen=True)
class Run:
    pid: int
    attempt: int
    started: float
    ended: float | None


@dataclass(frozen=True)
class GaveUp:
    """A worker's `lease_lost_handler_cancelled` for a key: when, and why (`lost`)."""

    at: float
    because: str = ""  # "refused": Postgres said another run holds the key; "unanswered": no answer in time


@dataclass
class Reruns:
    calls_repeated: Counter = field(default_factory=Counter)  # cause -> keys called successfully again
    extra_calls: Counter = field(default_factory=Counter)  # cause -> successful calls beyond one
    runs_repeated: Counter = field(default_factory=Counter)  # cause -> keys whose attempt ran again
    extra_runs: Counter = field(default_factory=Counter)  # cause -> runs beyond one per attempt


async def observe_runs(database_url: str) -> dict[str, list[Run]]:
    connection = await asyncpg.connect(database_url)
    try:
        rows = await connection.fetch(
            "SELECT key, pid, attempt, extract(epoch FROM started) AS s,"
            " extract(epoch FROM ended) AS e FROM chaos_runs ORDER BY started"
        )
    finally:
        await connection.close()
    runs: dict[str, list[Run]] = defaultdict(list)
    for row in rows:
        runs[row["key"]].append(
            Run(row["pid"], row["attempt"], float(row["s"]), None if row["e"] is None else float(row["e"]))
        )
    return runs


def judge_calls(
    successes: dict[str, list[Call]],
    runs: dict[str, list[Run]],
    applied: list[Applied],
    prunes: list[tuple[float, float]],
    workers: dict[int, str],
    verdict,
    reruns: Reruns,
    gave_up: dict[tuple[int, str], list[GaveUp]] | None = None,
    lock_ttl: float = 3.0,
) -> None:
    """`gave_up`: (pid, key) -> when that worker logged giving the key's lease up, and why: the
    evidence of a take while it was stopped, and the name of an unexplained repeat."""
    gave_up = gave_up or {}
    for key, calls in successes.items():
        causes: set[str] = set()
        for earlier, later in itertools.pairwise(calls):
            cause = _call_repeated_by(earlier, later, runs.get(key, []), applied, prunes, key, gave_up, lock_ttl)
            if cause is None:
                given_up = [
                    lost for lost in gave_up.get((earlier.pid, key), []) if earlier.started <= lost.at <= later.started
                ]
                why = (
                    (
                        f"; {_who(earlier, workers)} gave its lease up at {_clock(given_up[0].at)} "
                        f"(lease_lost_handler_cancelled, lost={given_up[0].because or '?'}) with no fault on it"
                    )
                    if given_up
                    else ""
                )
                kind = "call repeated after a lease given up" if given_up else "call repeated"
                verdict.violate(
                    kind,
                    f"{key}: called successfully by {_who(earlier, workers)} at "
                    f"{_clock(earlier.started)} and again by {_who(later, workers)} at "
                    f"{_clock(later.started)}, no kill, Postgres cut, pause past the lease or prune "
                    f"between{why}",
                )
                continue
            causes.add(cause)
            reruns.extra_calls[cause] += 1
        for cause in causes:
            reruns.calls_repeated[cause] += 1


def _call_repeated_by(
    earlier: Call,
    later: Call,
    runs: list[Run],
    applied: list[Applied],
    prunes: list[tuple[float, float]],
    key: str = "",
    gave_up: dict[tuple[int, str], list[GaveUp]] | None = None,
    lock_ttl: float = 3.0,
) -> str | None:
    """The downstream shares the run's loop with the traffic and the faults, so
    a call may be stamped a little after a fault that came after it was made:
    a process is killed once, so any kill of the earlier caller before the
    later call explains it; a cut from the earlier call's run on."""
    begun = _run_start(earlier, runs)
    for fault in applied:
        if fault.action == "kill" and fault.pid == earlier.pid and fault.started <= later.started:
            return "kill"
        if fault.action == "cut" and fault.service == "postgres" and fault.touches(earlier.pid, begun, later.started):
            return "cut postgres"
    for fault in applied:
        if fault.action == "pause" and earlier.pid == later.pid == fault.pid:
            # woken, it called before its refusal came back; the key, taken meanwhile, came back to it
            refusals = (gave_up or {}).get((earlier.pid, key), [])
            if (
                _run_start(earlier, runs) < fault.ended
                and earlier.started < fault.ended + PAUSE_SLACK_SECONDS
                and _taken_while_stopped(fault, earlier.pid, _run_start(later, runs), runs, refusals, lock_ttl)
            ):
                return "pause"
        if fault.action == "pause" and earlier.pid != later.pid and fault.pid in (earlier.pid, later.pid):
            woken, other = (earlier, later) if fault.pid == earlier.pid else (later, earlier)
            refusals = (gave_up or {}).get((woken.pid, key), [])
            if (
                _run_start(woken, runs) < fault.ended
                and woken.started < fault.ended + PAUSE_SLACK_SECONDS
                and (
                    fault.started <= _run_start(other, runs) <= fault.ended + PAUSE_SLACK_SECONDS
                    or _taken_while_stopped(fault, woken.pid, _run_start(other, runs), runs, refusals, lock_ttl)
                )
            ):
                return "pause"
    if any(earlier.ended + PRUNE_WINDOW_SECONDS < ended and begun < later.started for begun, ended in prunes):
        return "prune"
    return None


def _taken_while_stopped(
    pause: Applied, woken_pid: int, other_begun: float, runs: list[Run], gave_up: list[GaveUp], lock_ttl: float
) -> bool:
    """The stopped process was refused its lease on waking (`lost=refused`,
    within the TTL its confirmation may take), a run of the key by another
    process began between the pause's start and that refusal (the take it
    was refused for; PAUSE_SLACK_SECONDS for the taker's own statements),
    and the other call's run began no earlier than that take."""
    for lost in gave_up:
        if lost.because != "refused" or not pause.started <= lost.at <= pause.ended + lock_ttl + PAUSE_SLACK_SECONDS:
            continue
        takes = [
            run.started
            for run in runs
            if run.pid != woken_pid and pause.started <= run.started <= lost.at + PAUSE_SLACK_SECONDS
        ]
        if takes and min(takes) <= other_begun:
            return True
    return False


def _run_start(call: Call, runs: list[Run]) -> float:
    """When the run that made `call` began: its process's latest run of the key begun before the call."""
    begun = [run.started for run in runs if run.pid == call.pid and run.started <= call.started]
    return max(begun) if begun else call.started


def count_reruns(
    runs: dict[str, list[Run]],
    applied: list[Applied],
    prunes: list[tuple[float, float]],
    replayed_keys: set[str],
    reruns: Reruns,
) -> None:
    for key, key_runs in runs.items():
        causes: set[str] = set()
        by_attempt: dict[int, Run] = {}
        for run in key_runs:  # ordered by start
            before = by_attempt.get(run.attempt)
            by_attempt[run.attempt] = run
            if before is None:
                continue
            cause = _run_repeated_by(before, run, applied, prunes)
            if cause is None and run.attempt == 1 and key in replayed_keys:
                cause = "dead-letter replay"
            cause = cause or "none (a copy, a deferral)"
            causes.add(cause)
            reruns.extra_runs[cause] += 1
        for cause in causes:
            reruns.runs_repeated[cause] += 1


def _run_repeated_by(before: Run, run: Run, applied: list[Applied], prunes: list[tuple[float, float]]) -> str | None:
    touching = [fault for fault in applied if fault.touches(before.pid, before.started, run.started)]
    for cause in CAUSES[:5]:
        action, _, service = cause.partition(" ")
        if any(fault.action == action and fault.service == service for fault in touching):
            return cause
    for fault in applied:
        if fault.action in ("hog", "flush") and fault.started <= run.started and fault.ended >= before.started:
            return fault.action
    if any(begun < run.started and ended > before.started for begun, ended in prunes):
        return "prune"
    return None


def leases_given_up(logs: dict[int, Path]) -> dict[tuple[int, str], list[GaveUp]]:
    """(pid, key) -> when and why (`lost`) the worker's log says it cancelled
    a run for a lost lease (`lease_lost_handler_cancelled`)."""
    found: dict[tuple[int, str], list[GaveUp]] = defaultdict(list)
    for pid, path in logs.items():
        with contextlib.suppress(OSError):
            for line in path.read_text(errors="replace").splitlines():
                if '"lease_lost_handler_cancelled"' not in line:
                    continue
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    entry = json.loads(line)
                    at = datetime.fromisoformat(entry["timestamp"]).timestamp()
                    found[(pid, entry["key"])].append(GaveUp(at, entry.get("lost", "")))
    return found


def _clock(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).strftime("%H:%M:%S.%f")[:-3] + "Z"


def _who(call: Call, workers: dict[int, str]) -> str:
    return (
        f"pid {call.pid} ({workers[call.pid]}, attempt {call.attempt})"
        if call.pid in workers
        else f"pid {call.pid} (attempt {call.attempt})"
    )


def report_lines(reruns: Reruns, replayed_runs: Counter) -> list[str]:
    """Per fault kind: how many events were re-run, and why."""

    def counted(keys: Counter, extra: Counter, unit: str) -> str:
        return (
            ", ".join(
                f"{cause} {keys[cause]} ({extra[cause]} {unit})"
                for cause in sorted(keys, key=lambda cause: -keys[cause])
            )
            or "none"
        )

    lines = [
        f"re-called  events called downstream successfully again, by cause: "
        f"{counted(reruns.calls_repeated, reruns.extra_calls, 'extra calls')}",
        f"re-run     events an attempt of which ran again, by the fault on the earlier run's worker: "
        f"{counted(reruns.runs_repeated, reruns.extra_runs, 'extra runs')}",
    ]
    if replayed_runs:
        lines.append(
            "replayed   by design: "
            + ", ".join(
                f"event replay {rid}: {count} runs under replay keys" for rid, count in sorted(replayed_runs.items())
            )
        )
    return lines

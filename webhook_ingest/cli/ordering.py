"""`webhook-ingest ordering …`: ordering keys for on-call (docs/reference.md
§2; docs/design.md, "Ordering keys").

`ordering blocked` lists the lanes a dead letter blocks — each lane's later
events wait until that dead letter is replayed (`dlq replay ID`: it runs
again first, then the rest) or discarded (`dlq discard ID`: the rest go
on without it); `ordering show LANE` one lane: who holds it, until when,
its block, and the first rows waiting in the order they run. Needs only
`DATABASE_URL`.
"""

from collections.abc import Sequence
from datetime import timedelta

import click

from webhook_ingest.shared.db import to_json
from webhook_ingest.shared.ordering import (
    LANE_ROWS,
    BlockedLane,
    LaneState,
    blocked_document,
    blocked_lanes,
    lane_document,
    lane_state,
)

from .common import ENV_HELP, fail, run_or_fail
from .dlq import _settings, age, database, trimmed
from .terminal import echo

BLOCKED_LIMIT = 1000


@click.group(epilog=ENV_HELP)
def ordering() -> None:
    """Ordering keys: blocked lanes and one lane's state."""


@ordering.command("blocked", epilog=ENV_HELP)
@click.option("--source", default=None, help="only this source's lanes")
@click.option("--json", "as_json", is_flag=True, help="one JSON object a line on stdout")
def blocked_command(source: str | None, as_json: bool) -> None:
    """Lanes a dead letter blocks, oldest block first: replay or discard the dead letter to free one."""
    lanes = run_or_fail(_blocked(source))
    if as_json:
        for lane in lanes:
            echo(to_json(blocked_document(lane)).decode())
        return
    if not lanes:
        echo("no ordering key is blocked")
        return
    echo(render_blocked(lanes))


@ordering.command("show", epilog=ENV_HELP)
@click.argument("lane")
@click.option("--json", "as_json", is_flag=True, help="one JSON object on stdout")
def show_command(lane: str, as_json: bool) -> None:
    """One LANE (SOURCE[#ROUTE]:VALUE): holder, lease, block and the first rows waiting, in the order they run."""
    state = run_or_fail(_show(lane))
    if state is None:
        fail(f"no ordering lane {lane!r} (a lane with nothing waiting is forgotten after the prune window)")
    if as_json:
        echo(to_json(lane_document(state)).decode())
        return
    echo(render_lane(state))


async def _blocked(source: str | None) -> list[BlockedLane]:
    async with database(_settings()) as connection:
        return await blocked_lanes(connection, source, BLOCKED_LIMIT)


async def _show(lane: str) -> LaneState | None:
    async with database(_settings()) as connection:
        return await lane_state(connection, lane)


def render_blocked(lanes: list[BlockedLane]) -> str:
    header = ("SOURCE", "ROUTE", "KEY", "SINCE", "AGE", "DEAD LETTER", "WAITING")
    lines = [
        (
            lane.source,
            lane.route or "-",
            trimmed(lane.value, 48),
            lane.since.isoformat(timespec="seconds"),
            age(timedelta(seconds=lane.age_seconds)),
            str(lane.dead_letter_id),
            str(lane.waiting),
        )
        for lane in lanes
    ]
    return _table(header, lines)


def render_lane(state: LaneState) -> str:
    held = f"{state.holder} until {state.lease_until.isoformat()}" if state.held and state.lease_until else "nobody"
    block = (
        f"by dead letter {state.blocked_by} since {state.blocked_since.isoformat(timespec='seconds')}"
        f" (`dlq replay {state.blocked_by}` runs it first, then the rest; `dlq discard {state.blocked_by}` frees it)"
        if state.blocked_by is not None and state.blocked_since is not None
        else "no"
    )
    lines = [
        f"lane:      {state.lane}",
        f"source:    {state.source}" + (f"  route: {state.route}" if state.route else ""),
        f"held by:   {held}",
        f"blocked:   {block}",
        f"ready at:  {state.ready_at.isoformat() if state.ready_at else '-'}",
        f"last by:   {state.last_by if state.last_by is not None else '-'}",
        f"waiting:   {state.pending} (seqs given: {state.next_seq})",
    ]
    if state.rows:
        header = ("SEQ", "STATE", "KEY", "BY", "ACCEPTED", "ATTEMPT", "DEAD LETTER")
        rows = [
            (
                str(row.seq),
                row.state,
                trimmed(row.key, 48),
                "-" if row.by_value is None else str(row.by_value),
                row.accepted_at.isoformat(timespec="seconds"),
                str(row.attempt),
                "-" if row.dead_letter_id is None else str(row.dead_letter_id),
            )
            for row in state.rows
        ]
        shown = f"first {LANE_ROWS} rows" if len(state.rows) == LANE_ROWS else "rows"
        lines += ["", f"{shown}, in the order they run:", _table(header, rows)]
    return "\n".join(lines)


def _table(header: tuple[str, ...], lines: Sequence[tuple[str, ...]]) -> str:
    widths = [max(len(line[column]) for line in [header, *lines]) for column in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in [header, *lines]
    )

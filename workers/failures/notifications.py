"""Notifications of incidents (docs/oncall.md, "Incidents"): when one opens,
reopens or resolves, a message to Slack (an incoming-webhook URL) and to a
JSON webhook signed as Standard Webhooks, so its receiver can verify it.

They are sent from `incident_changes`, written in the transaction that
changed the incident: each worker runs a Notifier that claims due changes
for a while, sends each to every configured target not yet reached, and
records each target as it succeeds. A target that fails is tried again
with backoff (never the targets already reached); a worker that dies
mid-send leaves its claim to run out, and another worker sends it — so a
receiver may, in that one case, get a change twice: the JSON webhook's
`webhook-id` (`incident_change_<id>`) lets it tell. Sending never holds a
connection, a message or a handler: it runs beside processing.

One incident's changes reach each receiver in the order they happened
(`resolved` before `reopened`: a receiver applying them in turn ends with
the incident's state): they are sent one after another, oldest first, and
a change waiting out a retry holds back its incident's later ones. Other
incidents' changes go at once.

With no target configured there is nothing to send: the notifier only marks
the changes, and aiohttp (~90 ms of CPU at a worker's start) is imported
when a target is.
"""

import asyncio
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import asyncpg
import orjson

from webhook_ingest.shared.db import load_queries, pooled, raise_if_cancelled
from webhook_ingest.shared.errors import describe
from webhook_ingest.shared.incidents import incident_document
from webhook_ingest.shared.observability import get_logger
from webhook_ingest.shared.settings import Settings
from webhook_ingest.shared.signatures import sign

if TYPE_CHECKING:
    import aiohttp

log = get_logger(__name__)
# The incidents' changes, which this notifier claims and marks: in shared/incidents/queries.sql,
# beside the statements that write them.
SQL = load_queries("webhook_ingest.shared.incidents")

BATCH = 20
CLAIM_SECONDS = 60.0
SEND_SECONDS = 10.0
EVERY_SECONDS = 2.0
MAX_BACKOFF_SECONDS = 600.0


@dataclass(frozen=True)
class Change:
    id: int
    kind: str  # incident.opened, incident.reopened, incident.resolved
    actor: str
    at: str
    incident: dict


Send = Callable[["aiohttp.ClientSession", Change], Awaitable[None]]


def slack(url: str) -> Send:
    async def send(session: "aiohttp.ClientSession", change: Change) -> None:
        await _post(session, url, orjson.dumps({"text": slack_text(change)}), {})

    return send


def signed_webhook(url: str, secret: str) -> Send:
    async def send(session: "aiohttp.ClientSession", change: Change) -> None:
        body = orjson.dumps(
            {
                "type": change.kind,
                "timestamp": change.at,
                "data": {**change.incident, "change_id": change.id, "actor": change.actor},
            }
        )
        headers = sign(
            "standard-webhooks", body, secret, timestamp=int(time.time()), msg_id=f"incident_change_{change.id}"
        )
        await _post(session, url, body, headers)

    return send


def slack_text(change: Change) -> str:
    incident = change.incident
    what = _slack_escaped(
        f"{incident['source']} / {incident['handler'] or 'no handler'}: {incident['error_type']}: "
        f"{incident['error_pattern'][:300]}"
    )
    if change.kind == "incident.resolved":
        return f":white_check_mark: Incident {incident['id']} resolved by {change.actor} — {what}"
    verb = "reopened" if change.kind == "incident.reopened" else "opened"
    return (
        f":rotating_light: Incident {incident['id']} {verb} — {what} "
        f"({incident['failures']} failures, {incident['dead_letters']} dead letters)"
    )


def _slack_escaped(text: str) -> str:
    """Text Slack shows as typed: an error holds what a sender or a receiver
    chose, and Slack reads `<!channel>` as a mention of everyone and
    `<url|words>` as a link; `&`, `<` and `>` are the three it asks escaped."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


async def _post(session: "aiohttp.ClientSession", url: str, body: bytes, headers: dict[str, str]) -> None:
    import aiohttp

    async with session.post(
        url,
        data=body,
        headers={**headers, "Content-Type": "application/json"},
        timeout=aiohttp.ClientTimeout(total=SEND_SECONDS),
    ) as answer:
        if answer.status >= 300:
            # the target's name says which; its URL may be the secret itself (Slack's path)
            raise RuntimeError(f"answered {answer.status}")


def targets_from(settings: Settings) -> dict[str, Send]:
    """The targets the environment names (docs/reference.md §2)."""
    targets: dict[str, Send] = {}
    if settings.notify_slack_url:
        targets["slack"] = slack(settings.notify_slack_url)
    if settings.notify_webhook_url and settings.notify_webhook_secret:
        targets["webhook"] = signed_webhook(settings.notify_webhook_url, settings.notify_webhook_secret)
    return targets


class Notifier:
    def __init__(self, pool: asyncpg.Pool, targets: dict[str, Send]):
        self._pool = pool
        self._targets = targets  # name: send

    async def run_forever(self, every: float = EVERY_SECONDS) -> None:
        if not self._targets:
            await self._every(None, every)
        import aiohttp

        async with aiohttp.ClientSession() as session:
            await self._every(session, every)

    async def _every(self, session: "aiohttp.ClientSession | None", every: float) -> None:
        while True:
            try:
                await self.send_due(session)
            except Exception as exc:  # noqa: BLE001 - a late notification, never a dead task
                raise_if_cancelled()
                log.warning("incident_notifier_failed", error=describe(exc))
            await asyncio.sleep(every)

    async def send_due(self, session: "aiohttp.ClientSession | None") -> int:
        """Sends what is due now; how many changes it claimed. `session` may
        be None only for a notifier without targets."""
        claimed = await self._claim()
        if not self._targets:
            await self._execute(SQL["nothing_to_notify"], [change.id for change, _, _ in claimed])
            return len(claimed)
        assert session is not None, "a notifier with targets sends through a session"
        by_incident: dict[int, list[tuple[Change, list[str], int]]] = defaultdict(list)
        for claim in sorted(claimed, key=lambda claim: claim[0].id):
            by_incident[claim[0].incident["id"]].append(claim)
        await asyncio.gather(*(self._send_in_turn(session, claims) for claims in by_incident.values()))
        return len(claimed)

    async def _send_in_turn(
        self, session: "aiohttp.ClientSession", claims: list[tuple[Change, list[str], int]]
    ) -> None:
        """One incident's changes, oldest first; after one that failed, the later ones stay
        claimed and are claimed again behind it (claim_incident_changes)."""
        for change, done, attempts in claims:
            if not await self._send(session, change, done, attempts):
                return

    async def _claim(self) -> list[tuple[Change, list[str], int]]:
        async with pooled(self._pool, 5) as connection:
            rows = await connection.fetch(SQL["claim_incident_changes"], BATCH, CLAIM_SECONDS, timeout=5)
            incidents = {
                row["id"]: row
                for row in await connection.fetch(
                    SQL["incidents_by_id"], list({row["incident_id"] for row in rows}), timeout=5
                )
            }
        return [
            (
                Change(
                    row["id"],
                    _kind(row),
                    row["actor"],
                    row["at"].isoformat(),
                    incident_document(incidents[row["incident_id"]]),
                ),
                list(row["notified_targets"]),
                row["attempts"],
            )
            for row in rows
        ]

    async def _send(self, session: "aiohttp.ClientSession", change: Change, done: list[str], attempts: int) -> bool:
        """Sends the change to each target it has not reached; whether all have it now."""
        for name, send in self._targets.items():
            if name in done:
                continue
            try:
                await send(session, change)
            except Exception as exc:  # noqa: BLE001 - the receiver's failure: try again later
                backoff = min(5.0 * 2 ** (attempts - 1), MAX_BACKOFF_SECONDS)
                log.warning(
                    "incident_notification_failed",
                    change_id=change.id,
                    target=name,
                    error=describe(exc),
                    retry_in=backoff,
                )
                await self._execute(SQL["notification_failed"], change.id, backoff, f"{name}: {describe(exc)}")
                return False
            await self._execute(SQL["notified_target"], change.id, name, len(self._targets))
            log.info("incident_notified", change_id=change.id, kind=change.kind, target=name)
        return True

    async def _execute(self, statement: str, *args) -> None:
        async with pooled(self._pool, 5) as connection:
            await connection.execute(statement, *args, timeout=5)


def _kind(row) -> str:
    if row["state"] == "resolved":
        return "incident.resolved"
    return "incident.reopened" if row["reopened"] else "incident.opened"

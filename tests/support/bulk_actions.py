"""Dead-letter bulk actions in a test: a runner that dies mid-action (this
release's, or the previous release's during an upgrade), a publisher for a
bulk replay, and the console's Cancel of one."""

import contextlib
import re
from collections.abc import AsyncIterator

from aiohttp.test_utils import TestClient

from tests.support.ingress import console_login
from tests.support.processes import wait_until
from webhook_ingest.ingress.console.bulk import _DeadLetterJob
from webhook_ingest.ingress.publishing.publisher import Publisher
from webhook_ingest.shared.audit.actor import Actor
from webhook_ingest.shared.dead_letters.bulk import BulkAction
from webhook_ingest.shared.dead_letters.store import DeadLetterStore
from webhook_ingest.shared.runs import paced as paced_runs
from webhook_ingest.shared.settings import Settings


class DiesAfterItsFirstAct(_DeadLetterJob):
    """The job of a runner whose session ends (SIGKILL; Postgres cut from it)
    once its first dead letter is acted on, before its step commits."""

    async def act(self, dead_letter_id):
        acted = await super().act(dead_letter_id)
        assert self._held is not None
        self._held.hold.connection.terminate()
        return acted


class PreviousReleaseDiesAfterItsFirstAct(DiesAfterItsFirstAct):
    """A runner of the previous release (during an upgrade): its discard
    commits apart from its step (no audit entry of its own: a bulk act is
    audited at the run's end), then its session ends before the step."""

    async def act(self, dead_letter_id):
        await self._store.discard_if_open(dead_letter_id, self.actor, bulk_action_id=self.id)
        assert self._held is not None
        self._held.hold.connection.terminate()
        return True


async def claimed_bulk(store: DeadLetterStore, action: str, ids: list[int], actor: Actor) -> BulkAction:
    """A bulk `action` ("replay", "discard") of `ids`, prepared and claimed to run."""
    claimed = await store.claim_bulk(await store.prepare_bulk(action, ids, {}, actor), 1000)
    assert claimed is not None
    return claimed


async def died_after_its_first_act(
    store: DeadLetterStore,
    action: str,
    ids: list[int],
    actor: Actor,
    runner: type[DiesAfterItsFirstAct] = DiesAfterItsFirstAct,
    publisher: Publisher | None = None,
    namespace: str = "ns",
) -> BulkAction:
    """A bulk `action` of `ids` whose `runner` died with its first dead letter in flight."""
    claimed = await claimed_bulk(store, action, ids, actor)
    assert await paced_runs.run(runner(claimed, actor, store, publisher, namespace)) == "failed"
    return claimed


@contextlib.asynccontextmanager
async def connected_publisher(settings: Settings) -> AsyncIterator[Publisher]:
    """The ingress's publisher, connected to the test's broker and namespace (a bulk replay's)."""
    publisher = Publisher(settings.amqp_url, settings.namespace, settings.delivery_limit)
    publisher.start()
    try:
        await wait_until(lambda: _ready(publisher), 10, 0.02, "the publisher to connect")
        yield publisher
    finally:
        await publisher.close()


async def _ready(publisher: Publisher) -> bool:
    return publisher.ready


async def cancel_from_the_console(client: TestClient, action_id: int, token: str) -> str:
    """Logs in with `token`, opens the bulk action's page and presses its
    Cancel: the page that answers."""
    await console_login(client, token)
    page = await (await client.get(f"/console/bulk/{action_id}")).text()
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', page)[1]
    return await (await client.post(f"/console/bulk/{action_id}/cancel", data={"csrf_token": csrf})).text()

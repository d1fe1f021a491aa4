"""Dead-letter bulk actions in a test: a runner that dies mid-action, and the
console's Cancel of one."""

import re

from aiohttp.test_utils import TestClient

from tests.support.ingress import console_login
from webhook_ingest.ingress.console.bulk import _DeadLetterJob


class DiesAfterItsFirstAct(_DeadLetterJob):
    """The job of a runner whose session ends (SIGKILL; Postgres cut from it)
    once its first dead letter is acted on, before its step commits."""

    async def act(self, dead_letter_id):
        acted = await super().act(dead_letter_id)
        assert self._held is not None
        self._held.hold.connection.terminate()
        return acted


async def cancel_from_the_console(client: TestClient, action_id: int, token: str) -> str:
    """Logs in with `token`, opens the bulk action's page and presses its
    Cancel: the page that answers."""
    await console_login(client, token)
    page = await (await client.get(f"/console/bulk/{action_id}")).text()
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', page)[1]
    return await (await client.post(f"/console/bulk/{action_id}/cancel", data={"csrf_token": csrf})).text()

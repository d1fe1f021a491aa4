"""Signing a test client in to the web console, as an operator's browser does."""

import re


def csrf_of(page: str) -> str:
    """The CSRF token a console page's forms carry."""
    return re.search(r'name="csrf_token" value="([^"]+)"', page)[1]


async def signed_in(client, token: str) -> str:
    """Signs the client's cookie jar in with `token`; the session's CSRF token."""
    login = await (await client.get("/console/login")).text()
    response = await client.post("/console/login", data={"csrf_token": csrf_of(login), "token": token})
    assert response.status == 200 and "Overview" in await response.text()
    return csrf_of(await (await client.get("/console/dead-letters")).text())

"""ingress/server_log: a request aiohttp cannot parse is a 400 and no error
in the log (issue 21). The real app against the real services."""

import logging

import pytest

from tests.support.ingress import running_ingress
from tests.support.preauth import aiohttp_errors, exchange, preauth_sources, settings_with


@pytest.fixture
def sources(tmp_path):
    return preauth_sources(tmp_path)


async def test_a_malformed_request_is_a_400_and_no_error_in_the_log(settings, sources, monkeypatch, caplog):
    """aiohttp answers a request it cannot parse with 400 and logged each one
    at ERROR with a traceback: anyone, with a few bytes and no budget to
    spend, wrote an error into the log (scanners do it all day)."""
    caplog.set_level(logging.DEBUG, logger="aiohttp")
    malformed = [
        b"GET / HTTP/1.1\nHost: x\nX-Note: \x7f\n",
        b"GET /" + b"a" * 9000 + b" HTTP/1.1\nHost: x\n",
        b"POST /webhooks/open HTTP/1.1\nHost: x\nContent-Length: 1\nContent-Length: 2\n",
    ]
    async with running_ingress(settings_with(monkeypatch), sources) as client:
        statuses = [(await exchange(client.port, request))[0] for request in malformed]
    assert statuses == [400, 400, 400]
    assert aiohttp_errors(caplog) == []

"""Error text as logged, stored and shown: a URL's credentials and query never in it."""

import pytest

from webhook_ingest.shared.errors import describe, redacted


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            "http://user:pw@h.example:8080/hook?access_token=t answered 404",
            "http://***@h.example:8080/hook?*** answered 404",
        ),
        (
            "404, message='Not Found', url='https://u:p@h/x?a=b&c=d'",
            "404, message='Not Found', url='https://***@h/x?***'",
        ),
        ("URL('https://h/x?token=t')", "URL('https://h/x?***')"),
        (
            "amqp://guest:guest@127.0.0.1:5672/ and redis://:secret@r:6379/0",
            "amqp://***@127.0.0.1:5672/ and redis://***@r:6379/0",
        ),
        (
            "Cannot connect to host h:443 ssl:default [Connection refused]",
            "Cannot connect to host h:443 ssl:default [Connection refused]",
        ),
        ("https://h.example/hook answered 500", "https://h.example/hook answered 500"),
    ],
)
def test_a_urls_user_password_and_query_are_redacted_host_and_path_kept(text, expected):
    assert redacted(text) == expected


def test_describe_redacts():
    assert describe(RuntimeError("POST https://a:b@h/x?k=v failed")) == "RuntimeError: POST https://***@h/x?*** failed"
    assert describe(TimeoutError()) == "TimeoutError"

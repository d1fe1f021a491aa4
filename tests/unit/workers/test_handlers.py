"""A source's handler, looked up where it runs (the workers): what loads, and the one line a mistake gives."""

import functools
import sys

import pytest

from tests.support.handlers import counted_inbox
from webhook_ingest.shared.errors import ConfigError
from webhook_ingest.shared.sources.model import parse_source
from webhook_ingest.workers.handlers import batch_form, load_handlers
from webhook_ingest.workers.handlers.forward import handle as forward
from webhook_ingest.workers.handlers.inbox import handle as inbox


def source(handler: str, **options: object):
    return parse_source("acme", {"scheme": "github", "secrets": ["s"], "handler": handler, "handler_options": options})


def test_built_ins_and_module_functions_load():
    handlers = load_handlers(
        {
            "a": source("inbox"),
            "b": source("forward", url="http://x"),
            "c": source("tests.support.handlers:counted_inbox"),
            "d": source("forward", url="http://x", rate_limit={"per_second": 0.5, "burst": 3}),
        }
    )
    assert handlers == {"a": inbox, "b": forward, "c": counted_inbox, "d": forward}


@pytest.mark.parametrize(
    "handler, options, field, problem",
    [
        ("nope", {}, "handler", "'nope' is neither a built-in (forward, inbox) nor 'module:function'"),
        ("no_such_module_xyz:handle", {}, "handler", "cannot import 'no_such_module_xyz'"),
        ("json:no_such_function", {}, "handler", "'json' has no callable 'no_such_function'"),
        ("json:__doc__", {}, "handler", "'json' has no callable '__doc__'"),
        ("forward", {}, "handler_options.url", "the forward handler needs a url"),
        (
            "forward",
            {"url": "http://x", "rate_limit": 20},
            "handler_options.rate_limit",
            "must be a table { per_second = N, burst = N }",
        ),
        (
            "forward",
            {"url": "http://x", "rate_limit": {"per_second": 0}},
            "handler_options.rate_limit.per_second",
            "must be a positive number",
        ),
        ("forward", {"url": "http://x", "rate_limit": {}}, "handler_options.rate_limit.per_second", "is required"),
        (
            "forward",
            {"url": "http://x", "rate_limit": {"per_second": 5, "burst": 0.5}},
            "handler_options.rate_limit.burst",
            "must be a positive integer",
        ),
        (
            "forward",
            {"url": "http://x", "rate_limit": {"per_second": 5, "per_minute": 9}},
            "handler_options.rate_limit.per_minute",
            "unknown field (known: burst, per_second)",
        ),
        (
            "forward",
            {"url": "http://x", "headers": {"Authorization": "env:NO_SUCH_VARIABLE_XYZ"}},
            "handler_options.headers.Authorization",
            "environment variable NO_SUCH_VARIABLE_XYZ is not set",
        ),
        (
            "forward",
            {"url": "http://x", "headers": {"Idempotency-Key": "k"}},
            "handler_options.headers.Idempotency-Key",
            "forward sets this header itself",
        ),
        (
            "forward",
            {"url": "http://x", "headers": {"X-Count": 3}},
            "handler_options.headers",
            "a table of header names and string values",
        ),
    ],
)
def test_each_mistake_is_one_line_naming_the_source_and_the_field(handler, options, field, problem):
    with pytest.raises(ConfigError) as raised:
        load_handlers({"acme": source(handler, **options)})
    message = str(raised.value)
    assert message.startswith(f"source 'acme': {field}: ")
    assert problem in message and "\n" not in message


class AsyncCallable:
    async def __call__(self, event, ctx):
        return None


class SyncCallable:
    def __call__(self, event, ctx):
        return None


def plain_handle(event, ctx):
    return None


async_callable, sync_callable = AsyncCallable(), SyncCallable()


async def with_plain_batch(event, ctx):
    return None


with_plain_batch.batchable = True  # type: ignore[attr-defined]
with_plain_batch.batch = plain_handle  # type: ignore[attr-defined]


def test_a_batch_form_copied_by_functools_wraps_is_not_the_wrappers():
    async def many(events, ctx):
        return None

    @functools.wraps(with_plain_batch)
    async def wrapper(event, ctx):
        return None

    assert wrapper.batch is plain_handle and batch_form(wrapper) is None  # copied: the wrapper runs alone
    wrapper.batch = many  # type: ignore[attr-defined]  # its own
    assert batch_form(wrapper) is many and batch_form(with_plain_batch) is plain_handle


def test_a_handlers_batch_form_that_is_not_async_is_refused_at_start():
    with pytest.raises(ConfigError) as raised:
        load_handlers({"acme": source(f"{__name__}:with_plain_batch")})
    assert "with_plain_batch'.batch is not an async function" in str(raised.value)


@pytest.mark.parametrize("handler", [f"{__name__}:plain_handle", f"{__name__}:sync_callable", "json:loads"])
def test_a_handler_that_is_not_async_is_refused_at_start(handler):
    with pytest.raises(ConfigError) as raised:
        load_handlers({"acme": source(handler)})
    message = str(raised.value)
    assert message.startswith(f"source 'acme': handler: {handler!r} is not an async function")
    assert "async def" in message and "\n" not in message


def test_an_object_whose_call_is_async_is_a_handler():
    assert load_handlers({"acme": source(f"{__name__}:async_callable")}) == {"acme": async_callable}


def test_a_handler_module_that_cannot_be_found_says_where_the_worker_looks():
    with pytest.raises(ConfigError) as raised:
        load_handlers({"acme": source("no_such_module_xyz:handle")})
    assert str(raised.value) == (
        "source 'acme': handler: cannot import 'no_such_module_xyz': No module named 'no_such_module_xyz';"
        f" install it into this Python environment ({sys.prefix}) or put its folder on PYTHONPATH"
        " (the current directory is not on the webhook-ingest command's import path)"
    )


def test_a_handler_module_whose_dependency_is_missing_names_it(tmp_path, monkeypatch):
    (tmp_path / "handler_needing_xyz.py").write_text("import no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as raised:
        load_handlers({"acme": source("handler_needing_xyz:handle")})
    assert str(raised.value) == (
        "source 'acme': handler: cannot import 'handler_needing_xyz': No module named 'no_such_dependency_xyz';"
        f" install 'no_such_dependency_xyz' into this Python environment ({sys.prefix})"
    )


def test_a_forms_payload_is_its_decoded_fields_and_the_inbox_stores_them_as_json():
    import json
    from datetime import UTC, datetime

    from webhook_ingest.workers.handlers import Event
    from webhook_ingest.workers.handlers.inbox import _payload_json

    def event(body: bytes, content_type: str) -> Event:
        return Event(
            source="sms",
            event_id="e",
            key="sms:e",
            headers={"content-type": content_type},
            received_at=datetime.now(UTC),
            attempt=1,
            body=body,
        )

    form = event(b"Body=hi+there&Media=a&Media=b&Empty=", "application/x-www-form-urlencoded; charset=utf-8")
    assert form.payload == {"Body": "hi there", "Media": ["a", "b"], "Empty": ""}
    assert json.loads(_payload_json(form)) == form.payload
    plain = event(b'{"n": 12345678901234567890123}', "application/json")
    assert plain.payload == {"n": 12345678901234567890123} and _payload_json(plain) == plain.body.decode()

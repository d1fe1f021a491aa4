"""A source's routes (docs/reference.md §3 `routes`): parsing, the one-line
refusals, the route key, and the type filter (the `ignore` rules' globs)."""

import fnmatch
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.events import make_event
from webhook_ingest.shared.errors import ConfigError
from webhook_ingest.shared.event.message import from_amqp, to_amqp
from webhook_ingest.shared.sources.model import parse_source
from webhook_ingest.shared.sources.routes import NAME, derived_name, route_key
from webhook_ingest.workers.fan_out import route_messages
from webhook_ingest.workers.handlers import load_handlers
from webhook_ingest.workers.handlers.inbox import handle as inbox

BASE = {"scheme": "stripe", "secrets": ["s"]}


def routed(*routes: dict, **extra):
    return parse_source("acme", {**BASE, "routes": list(routes), **extra})


def test_routes_parse_with_their_handlers_options_and_filters():
    source = routed(
        {"handler": "billing:on_invoice", "types": ["invoice.*"]},
        {"name": "all", "handler": "inbox", "handler_options": {"x": 1}},
        {"name": "one", "handler": "inbox", "types": "customer.created"},
    )
    assert [route.name for route in source.routes] == ["billing-on_invoice", "all", "one"]
    assert source.handler == "" and source.handler_for("all") == ("inbox", {"x": 1})
    assert [r.name for r in source.routes_taking({}, {"type": "invoice.paid"})] == ["billing-on_invoice", "all"]
    assert [r.name for r in source.routes_taking({}, {"type": "customer.created"})] == ["all", "one"]
    assert [r.name for r in source.routes_taking({}, {"no": "type"})] == ["all"]


def test_a_single_handler_stays_as_it_was():
    source = parse_source("acme", {**BASE, "handler": "inbox", "handler_options": {"x": 1}})
    assert source.routes == () and source.handler_for("") == ("inbox", {"x": 1})
    assert load_handlers({"acme": source}) == {"acme": inbox}


def test_each_route_handler_is_loaded_under_source_and_route():
    source = routed({"name": "a", "handler": "inbox"}, {"name": "b", "handler": "inbox"})
    assert load_handlers({"acme": source}) == {"acme#a": inbox, "acme#b": inbox}
    with pytest.raises(ConfigError, match=r"^source 'acme': routes\[1\]\.handler_options\.url: the forward handler"):
        load_handlers({"acme": routed({"name": "a", "handler": "inbox"}, {"name": "b", "handler": "forward"})})


@pytest.mark.parametrize(
    "section, where, problem",
    [
        ({}, "handler", "is required (or [[sources.NAME.routes]]"),
        ({"handler": "inbox", "routes": [{"handler": "inbox"}]}, "routes", "one handler or routes, not both"),
        ({"routes": []}, "routes", "must be a non-empty list"),
        ({"routes": [{"handler": "inbox"}], "handler_options": {"a": 1}}, "handler_options", "put them in each route"),
        ({"routes": [{"handler": "inbox"}, {"handler": "inbox"}]}, "routes[1].name", "'inbox' is already a route"),
        (
            {"routes": [{"name": "a", "handler": "inbox"}, {"name": "a", "handler": "x:y"}]},
            "routes[1].name",
            "'a' is already a route",
        ),
        ({"routes": [{"name": "a#b", "handler": "inbox"}]}, "routes[0].name", "1 to 64 of"),
        ({"routes": [{"name": "", "handler": "inbox"}]}, "routes[0].name", "1 to 64 of"),
        (
            {"routes": [{"handler": "inbox", "typo": 1}]},
            "routes[0].typo",
            "unknown field (known: handler, handler_options",
        ),
        ({"routes": [{"handler": "inbox", "types": []}]}, "routes[0].types", "an empty list takes no event"),
        ({"routes": [{"handler": "inbox", "types": ["a", 3]}]}, "routes[0].types[1]", "must be an event type glob"),
        (
            {"routes": [{"handler": "inbox", "types": ["a"]}], "event_type": []},
            "routes[0].types",
            "the source has no event type",
        ),
        ({"routes": [{}]}, "routes[0].handler", "is required"),
        ({"routes": "inbox"}, "routes", "must be a non-empty list"),
    ],
)
def test_each_mistake_is_one_line_naming_the_source_and_the_route(section, where, problem):
    with pytest.raises(ConfigError) as raised:
        parse_source("acme", {**BASE, **section})
    message = str(raised.value)
    assert message.startswith(f"source 'acme': {where}: "), message
    assert problem in message and "\n" not in message


values = st.one_of(
    st.text(max_size=12),
    st.integers(),
    st.booleans(),
    st.none(),
    st.lists(st.text(max_size=8), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)
route_tables = st.dictionaries(
    st.sampled_from(["name", "handler", "types", "handler_options", "other"]), values, max_size=5
)


@given(st.lists(route_tables, max_size=4))
def test_any_routes_table_is_routes_or_one_line_naming_where(tables):
    try:
        source = routed(*tables)
    except ConfigError as exc:
        assert str(exc).startswith("source 'acme': routes") and "\n" not in str(exc)
        return
    names = [route.name for route in source.routes]
    assert len(set(names)) == len(names) and all(NAME.fullmatch(name) for name in names)


def test_a_route_name_none_is_one_line_naming_it():
    """Found by the property test above on CI's run: a table built in
    Python (TOML has no null) with `name` None; 5 or a list already say
    "must be a string"."""
    with pytest.raises(ConfigError) as refused:
        routed({"name": None, "handler": "inbox"})
    assert str(refused.value).startswith("source 'acme': routes[0].name") and "\n" not in str(refused.value)


@given(st.text(min_size=1, max_size=30))
def test_a_derived_name_is_a_name(handler):
    assert NAME.fullmatch(derived_name(handler))


@given(
    st.text(max_size=20), st.from_regex(NAME, fullmatch=True), st.text(max_size=20), st.from_regex(NAME, fullmatch=True)
)
def test_two_pairs_never_share_a_route_key(key1, route1, key2, route2):
    if (key1, route1) != (key2, route2):
        assert route_key(key1, route1) != route_key(key2, route2)


@given(st.text(alphabet="ab.*?[]!", max_size=6), st.text(alphabet="ab.", min_size=1, max_size=6))  # "": no type
def test_types_match_as_fnmatch_reads_globs(glob, event_type):
    source = routed({"name": "r", "handler": "inbox", "types": [glob]})
    try:
        expected = re.compile(fnmatch.translate(glob)).match(event_type) is not None
    except re.error:
        return
    assert bool(source.routes_taking({}, {"type": event_type})) == expected


def test_the_fan_out_gives_each_route_its_key_and_the_route_travels():
    source = routed(
        {"name": "billing", "handler": "inbox", "types": ["invoice.*"]}, {"name": "all", "handler": "inbox"}
    )
    event = make_event("acme", "evt_1", {"type": "invoice.paid"})
    messages = route_messages(source, event)
    assert [(m.key, m.route) for m in messages] == [("acme:evt_1#billing", "billing"), ("acme:evt_1#all", "all")]
    wire = to_amqp(messages[0])
    assert wire.headers["x-route"] == "billing"
    assert from_amqp(wire.body, wire.headers).route == "billing"
    assert "x-route" not in to_amqp(event).headers and from_amqp(event.body, to_amqp(event).headers).route == ""
    assert [m.route for m in route_messages(source, make_event("acme", "evt_2", {"type": "x"}))] == ["all"]


async def test_forwards_rate_is_one_bucket_per_route():
    from webhook_ingest.workers.delivery_rate import DeliveryRate, shared_buckets, wait_for_turn

    options = {"rate_limit": {"per_second": 0.01, "burst": 1}}
    await wait_for_turn("routed", options, "a")  # the first turn is at once; the next 100 s away
    rate = DeliveryRate(per_second=0.01, burst=1)
    assert await shared_buckets.retry_after("forward:routed#a", rate) > 0
    assert await shared_buckets.retry_after("forward:routed#b", rate) == 0  # route b's own bucket
    assert await shared_buckets.retry_after("forward:routed", rate) == 0  # and the source's, untouched

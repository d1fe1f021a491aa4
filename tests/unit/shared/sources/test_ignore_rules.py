"""A source's `ignore` rules (shared/sources/ignore_rules.py): which events they
match, the rule they name, and the one line a bad rule stops start-up with."""

import fnmatch
import glob
import re

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from webhook_ingest.shared.errors import ConfigError
from webhook_ingest.shared.event import ids as event_id
from webhook_ingest.shared.sources import ignore_rules
from webhook_ingest.shared.sources.ignore_rules import IgnoreRuleError
from webhook_ingest.shared.sources.model import parse_source

BODY_TYPE = event_id.parse_selectors(["body:type"])
GLOB_TEXT = st.text(alphabet="ab.*?[]!-/", max_size=8)
JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=8))
KEYS = st.text(alphabet="abcxyz_", min_size=1, max_size=4)


def rules(table: dict, event_type=BODY_TYPE) -> ignore_rules.IgnoreRules:
    return ignore_rules.parse(table, event_type)


@given(pattern=GLOB_TEXT, text=GLOB_TEXT)
@example(pattern="charge.*", text="charge.updated")
@example(pattern="[!a]", text="b")
def test_a_string_matches_as_fnmatch_would_case_sensitively(pattern, text):
    matched = rules({"type": [pattern]}).matching({}, {"type": text}) is not None
    assert matched == (text != "" and fnmatch.fnmatchcase(text, pattern))  # an empty type is no type (§5)


@given(type_=st.text(min_size=1, max_size=20), other=st.text(min_size=1, max_size=20))
def test_an_escaped_type_matches_itself_and_nothing_else(type_, other):
    matcher = rules({"type": [glob.escape(type_)]})
    assert matcher.matching({}, {"type": type_}) == f"type={glob.escape(type_)}"
    assert (matcher.matching({}, {"type": other}) is None) == (other != type_)


@given(st.text(min_size=1, max_size=20))
def test_a_star_matches_every_type_and_no_event_without_one(type_):
    matcher = rules({"type": "*"})
    assert matcher.matching({}, {"type": type_}) == "type=*"
    assert matcher.matching({}, {"kind": type_}) is None


@given(
    written=st.one_of(st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False)),
    found=JSON_SCALARS,
)
@example(written=False, found=0)
@example(written=0, found=False)
@example(written=True, found=1.0)
@example(written=1, found=1.0)
def test_true_false_and_numbers_match_only_their_own_json_kind(written, found):
    matched = rules({"body:data.livemode": [written]}).matching({}, {"data": {"livemode": found}}) is not None
    same_kind = isinstance(written, bool) == isinstance(found, bool) and isinstance(found, bool | int | float)
    assert matched == (same_kind and found == written)


@given(path=st.lists(KEYS, min_size=1, max_size=4), value=st.text(alphabet="abc", max_size=6))
def test_a_body_path_matches_the_value_it_points_at_and_not_a_neighbour(path, value):
    payload: object = value
    for key in reversed(path):
        payload = {key: payload}
    field = "body:" + ".".join(path)
    matcher = rules({field: [glob.escape(value)]})
    assert matcher.matching({}, payload) == f"{field}={glob.escape(value)}"
    assert matcher.matching({}, {path[0] + "_": value, "type": value}) is None


def test_headers_match_by_name_whatever_its_case_and_templates_join_their_parts():
    matcher = rules({"header:X-Topic": ["orders/*"], "{body.kind}:{body.env}": ["ping:test"]})
    assert matcher.matching({"x-topic": "orders/create"}, {}) == "header:X-Topic=orders/*"
    assert matcher.matching({}, {"kind": "ping", "env": "test"}) == "{body.kind}:{body.env}=ping:test"
    assert matcher.matching({"x-topic": "products/create"}, {"kind": "ping", "env": "live"}) is None


def test_rules_read_an_unsigned_header_unless_the_scheme_signs_it():
    assert rules({"header:X-Topic": ["orders/*"]}).read_unsigned_headers({})
    assert rules({"{body.kind}:{header.X-Env}": ["ping:*"]}).read_unsigned_headers({})
    assert not rules({"header:webhook-id": ["msg_*"]}).read_unsigned_headers({"webhook-id": "msg_1"})
    assert not rules({"body:livemode": [False], "type": ["ping"]}).read_unsigned_headers({})  # a type is bound as such


def test_the_first_rule_and_value_in_the_files_order_names_the_match():
    matcher = rules({"body:livemode": [False], "type": ["ping", "p*"]})
    assert matcher.matching({}, {"type": "ping", "livemode": False}) == "body:livemode=false"
    assert matcher.matching({}, {"type": "ping", "livemode": True}) == "type=ping"
    assert matcher.matching({}, {"type": "pong", "livemode": True}) == "type=p*"


@pytest.mark.parametrize(
    "table, where, problem",
    [
        ({"cookie:x": ["a"]}, '"cookie:x"', "a rule's field is 'type' or a selector"),
        ({"body:a..b": ["a"]}, '"body:a..b"', "empty segment"),
        ({"type": []}, "type", "an empty list ignores nothing"),
        ({"type": ["a", {"b": 1}]}, "type[1]", "a string (a glob), true, false or a finite number"),
        ({"body:n": float("nan")}, '"body:n"', "finite number"),
    ],
)
def test_a_bad_rule_names_its_field(table, where, problem):
    with pytest.raises(IgnoreRuleError, match=re.escape(problem)) as raised:
        rules(table)
    assert raised.value.where == where


@given(
    st.one_of(
        st.dictionaries(KEYS, st.integers(), max_size=2), st.dates(), st.lists(st.lists(st.integers()), min_size=1)
    )
)
def test_any_other_value_is_refused(value):
    with pytest.raises(IgnoreRuleError):
        rules({"type": value})


SECTION = {"scheme": "stripe", "secrets": ["whsec_x"], "handler": "inbox"}


def test_the_sources_file_compiles_a_sources_rules_against_its_event_type():
    source = parse_source("stripe", {**SECTION, "ignore": {"type": ["ping"], "body:data.object.livemode": False}})
    assert source.ignore.matching({}, {"type": "ping"}) == "type=ping"
    assert (
        source.ignore.matching({}, {"type": "x", "data": {"object": {"livemode": False}}})
        == "body:data.object.livemode=false"
    )
    assert parse_source("plain", SECTION).ignore.matching({}, {"type": "ping"}) is None


@pytest.mark.parametrize(
    "section, line",
    [
        ({**SECTION, "ignore": {"type": []}}, "source 'stripe': ignore.type: an empty list ignores nothing"),
        ({**SECTION, "ignore": {"body:": [1]}}, "source 'stripe': ignore.\"body:\": selector 'body:': empty path"),
        ({**SECTION, "ignore": ["type"]}, "source 'stripe': ignore: must be a table of rules"),
        (
            {**SECTION, "event_type": [], "ignore": {"type": "ping"}},
            "source 'stripe': ignore.type: the source has no event",
        ),
        (
            {**SECTION, "scheme": "twilio", "public_url": "https://h/w", "ignore": {"type": "x"}},
            "source 'stripe': ignore.type: the source has no event type",
        ),
    ],
)
def test_a_bad_rule_stops_start_up_with_one_line_naming_the_source_and_the_field(section, line):
    with pytest.raises(ConfigError) as raised:
        parse_source("stripe", section)
    assert str(raised.value).startswith(line) and "\n" not in str(raised.value)

"""shared.event.ids: selectors, canonical JSON, content hashes (docs/reference.md §5)."""

import hashlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict

from webhook_ingest.shared import signatures
from webhook_ingest.shared.event import ids as event_id
from webhook_ingest.shared.event.ids import (
    DEFAULT_EVENT_ID,
    SelectorError,
    canonical_json,
    fallback_event_id,
    hashed_content,
    idempotency_key,
    parse_hash_fields,
    parse_selectors,
    payload_sha256,
    resolve_event_id,
)

PAYSTACK_CHARGE_SUCCESS = {
    "event": "charge.success",
    "data": {
        "id": 302961,
        "domain": "live",
        "status": "success",
        "reference": "qTPrJoy9Bx",
        "amount": 10000,
        "message": None,
        "gateway_response": "Approved by Financial Institution",
        "paid_at": "2016-09-30T21:10:19.000Z",
        "created_at": "2016-09-30T21:09:56.000Z",
        "channel": "card",
        "currency": "NGN",
        "ip_address": "41.242.49.37",
        "metadata": 0,
        "log": {
            "time_spent": 16,
            "attempts": 1,
            "errors": 0,
            "success": False,
            "mobile": False,
            "input": [],
            "channel": None,
            "history": [],
        },
        "fees": None,
        "customer": {
            "id": 68324,
            "first_name": "BoJack",
            "last_name": "Horseman",
            "email": "bojack@horseman.com",
            "customer_code": "CUS_qo38as2hpsgk2r0",
            "phone": None,
            "metadata": None,
            "risk_action": "default",
        },
        "authorization": {
            "authorization_code": "AUTH_f5rnfq9p",
            "bin": "539999",
            "last4": "8877",
            "exp_month": "08",
            "exp_year": "2020",
            "card_type": "mastercard DEBIT",
            "bank": "Guaranty Trust Bank",
            "country_code": "NG",
            "brand": "mastercard",
            "account_name": "BoJack Horseman",
        },
        "plan": {},
    },
}


def resolve(specs, headers=None, payload=None):
    return resolve_event_id(parse_selectors(specs), CIMultiDict(headers or {}), payload)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- selectors -----------------------------------------------------------------------------------


def test_header_selector_ignores_case():
    headers = {"x-github-delivery": "72d3162e-cc78-11e3-81ab-4c9367dc0958"}
    assert resolve(["header:X-GitHub-Delivery"], headers) == "72d3162e-cc78-11e3-81ab-4c9367dc0958"


def test_header_selector_also_reads_a_plain_dict_of_lower_case_names():
    selectors = parse_selectors(["header:X-Event-ID"])
    assert resolve_event_id(selectors, {"x-event-id": "e1"}, {}) == "e1"


def test_body_selector_follows_dotted_path():
    assert resolve(["body:data.object.id"], payload={"data": {"object": {"id": "ch_1"}}}) == "ch_1"


def test_numeric_segment_indexes_a_list():
    payload = {"entry": [{"id": "a"}, {"id": "b"}]}
    assert resolve(["body:entry.1.id"], payload=payload) == "b"
    assert resolve(["body:entry.2.id"], payload=payload) is None


def test_numeric_segment_is_a_key_in_an_object():
    assert resolve(["body:items.0"], payload={"items": {"0": "zero"}}) == "zero"


@pytest.mark.parametrize(
    "payload",
    [
        {},
        {"data": None},
        {"data": "text"},
        {"data": []},
        {"data": {"other": 1}},
        [],
        "x",
        7,
        None,
    ],
)
def test_missing_path_does_not_resolve(payload):
    assert resolve(["body:data.id"], payload=payload) is None


def test_missing_header_does_not_resolve():
    assert resolve(["header:X-Event-ID"], {"X-Other": "1"}) is None


def test_int_resolves_to_its_decimal_string():
    assert resolve(["body:id"], payload={"id": 12345678901234567890}) == "12345678901234567890"
    assert resolve(["body:id"], payload={"id": 0}) == "0"


@pytest.mark.parametrize("value", [True, False, 1.0, 1.5, None, {}, {"a": 1}, [], ["a"], ""])
def test_other_body_values_do_not_resolve(value):
    assert resolve(["body:id"], payload={"id": value}) is None


def test_first_non_empty_selector_wins():
    specs = ["header:X-Event-ID", "body:id", "body:event_id"]
    assert resolve(specs, {"X-Event-ID": ""}, {"id": "", "event_id": "ev_3"}) == "ev_3"
    assert resolve(specs, {"X-Event-ID": "h"}, {"id": "b", "event_id": "ev_3"}) == "h"
    assert resolve(specs, {}, {"id": True, "event_id": 9}) == "9"


def test_no_selector_resolving_gives_none():
    assert resolve(["header:X-Event-ID", "body:id"], {}, {"name": "x"}) is None
    assert resolve([], {"X-Event-ID": "h"}, {"id": "b"}) is None


def test_paystack_default_template():
    selectors = parse_selectors(DEFAULT_EVENT_ID["paystack"])
    event_id = resolve_event_id(selectors, CIMultiDict(), PAYSTACK_CHARGE_SUCCESS)
    assert event_id == "charge.success:302961:qTPrJoy9Bx"


def test_template_resolves_only_when_every_placeholder_does():
    template = ["{body.event}:{body.data.id}"]
    assert resolve(template, payload={"event": "e", "data": {}}) is None
    assert resolve(template, payload={"event": "", "data": {"id": 1}}) is None
    assert resolve(template, payload={"event": "e", "data": {"id": True}}) is None
    assert resolve([*template, "body:event"], payload={"event": "e", "data": {}}) == "e"


def test_template_mixes_headers_literals_and_list_indexes():
    specs = ["evt-{header.X-Topic}/{body.items.0.sku}{body.n}"]
    assert resolve(specs, {"x-topic": "orders"}, {"items": [{"sku": "S1"}], "n": 2}) == "evt-orders/S12"


def test_selectors_keep_their_spec_for_messages():
    specs = ["header:X-Id", "body:a.0.b", "{body.event}:{header.X-Id}"]
    assert [selector.spec for selector in parse_selectors(specs)] == specs


# --- defaults per scheme (docs/reference.md §4) ---------------------------------------------------------------


def test_defaults_cover_every_scheme_and_parse():
    assert set(DEFAULT_EVENT_ID) == set(signatures.SCHEMES)
    for specs in DEFAULT_EVENT_ID.values():
        assert len(parse_selectors(specs)) == len(specs)


def scheme_id(scheme, headers=None, payload=None):
    return resolve(DEFAULT_EVENT_ID[scheme], headers, payload if payload is not None else {})


def test_stripe_default():
    assert (
        scheme_id("stripe", payload={"id": "evt_1NG8Du2eZvKYlo2CUI79vXWy", "type": "charge.succeeded"})
        == "evt_1NG8Du2eZvKYlo2CUI79vXWy"
    )


def test_github_default():
    assert scheme_id("github", {"X-GitHub-Delivery": "d-1"}, {"id": "ignored"}) == "d-1"


def test_shopify_default_prefers_webhook_id_then_event_id():
    both = {"X-Shopify-Webhook-Id": "w-1", "X-Shopify-Event-Id": "e-1"}
    assert scheme_id("shopify", both) == "w-1"
    assert scheme_id("shopify", {"x-shopify-event-id": "e-1"}) == "e-1"


def test_standard_webhooks_default_falls_back_to_svix_id():
    assert scheme_id("standard-webhooks", {"webhook-id": "msg_1", "svix-id": "msg_2"}) == "msg_1"
    assert scheme_id("standard-webhooks", {"Svix-Id": "msg_2"}) == "msg_2"


def test_hmac_sha256_default_order():
    payload = {"id": "i", "event_id": "e", "messageId": "m"}
    assert scheme_id("hmac-sha256", {"X-Event-ID": "h"}, payload) == "i"  # the signed body's first
    assert scheme_id("hmac-sha256", {"X-Event-ID": "h"}, {"other": 1}) == "h"
    assert scheme_id("hmac-sha256", {}, payload) == "i"
    assert scheme_id("hmac-sha256", {}, {"event_id": "e", "messageId": "m"}) == "e"
    assert scheme_id("hmac-sha256", {}, {"messageId": "m"}) == "m"


def test_slack_default_is_the_event_id_else_a_commands_trigger_id():
    assert scheme_id("slack", {}, {"type": "event_callback", "event_id": "Ev08"}) == "Ev08"
    assert scheme_id("slack", {}, {"command": "/deploy", "trigger_id": "1334.7384.80889"}) == "1334.7384.80889"


def test_gitlab_default_is_the_idempotency_key_not_the_event_uuid():
    # X-Gitlab-Event-UUID is shared by every hook one request triggers (two events to one hook would
    # collide), X-Gitlab-Webhook-UUID is new on each retry; Idempotency-Key is neither.
    headers = {"Idempotency-Key": "908a6d9e", "X-Gitlab-Event-UUID": "shared", "X-Gitlab-Webhook-UUID": "per-try"}
    assert scheme_id("gitlab", headers, {"object_kind": "push"}) == "908a6d9e"
    assert scheme_id("gitlab", {"X-Gitlab-Event-UUID": "shared"}, {"object_kind": "push"}) is None  # hashed


def test_twilio_square_and_v1a_defaults():
    assert scheme_id("twilio", {"I-Twilio-Idempotency-Token": "tok"}, {"MessageSid": "SM1"}) == "tok"
    assert scheme_id("square", {}, {"event_id": "ac3ac95b", "type": "payment.created"}) == "ac3ac95b"
    assert scheme_id("standard-webhooks-v1a", {"svix-id": "msg_2"}) == "msg_2"
    assert DEFAULT_EVENT_ID["basic-auth"] == DEFAULT_EVENT_ID["api-key"] == DEFAULT_EVENT_ID["hmac-sha256"]


# --- malformed selectors -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec",
    [
        "",
        "id",
        "headers:X",
        "Header:X",
        "json:id",
        "header:",
        "body:",
        "body:a..b",
        "body:.a",
        "body:a.",
        "body: id",
        "header:X Id",
        "header:X:Y",
        "{body.id",
        "body.id}",
        "{{body.id}}",
        "{body.a}}",
        "}{",
        "evt-",
        "{}",
        "{body}",
        "{body.}",
        "{header}",
        "{header.}",
        "{id}",
        "{headers.X}",
        "{ body.id }",
        "{body.a..b}",
    ],
)
def test_malformed_selector_is_rejected(spec):
    with pytest.raises(SelectorError, match="selector"):
        parse_selectors([spec])


def test_selector_error_names_the_selector():
    with pytest.raises(SelectorError, match=r"'\{body.event\}:\{data.id\}'.*placeholder \{data.id\}"):
        parse_selectors(["body:id", "{body.event}:{data.id}"])


def test_selector_list_must_be_a_list_of_strings():
    with pytest.raises(SelectorError):
        parse_selectors("body:id")
    with pytest.raises(SelectorError):
        parse_selectors([42])


@pytest.mark.parametrize("spec", ["evt-{}", "{}:{}", "order-}", "{order"])
def test_template_without_placeholders_is_rejected(spec):
    with pytest.raises(SelectorError):
        parse_selectors([spec])


def test_selector_error_is_a_value_error():
    assert issubclass(SelectorError, ValueError)


selector_alphabet = st.sampled_from(list("{}.:-_ aAbBdeohrXy0129é\t"))
selector_like_text = st.one_of(
    st.text(),
    st.text(selector_alphabet, max_size=24),
    st.tuples(
        st.sampled_from(["header:", "body:", "{body.", "{header.", "x{", "}"]), st.text(selector_alphabet, max_size=16)
    ).map("".join),
)


@given(selector_like_text)
def test_any_text_parses_or_raises_selector_error(spec):
    try:
        selectors = parse_selectors([spec])
    except SelectorError as error:
        assert spec in str(error) or repr(spec) in str(error)
    else:
        assert len(selectors) == 1 and selectors[0].spec == spec


# --- canonical JSON and hashes -------------------------------------------------------------------

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(10**60), max_value=10**60),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(),
    st.text(st.sampled_from("abc012")),
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(
            st.one_of(st.text(max_size=6), st.text(st.sampled_from("abc012"), max_size=2)), children, max_size=4
        ),
    ),
    max_leaves=20,
)


@given(json_values)
def test_canonical_json_is_the_contracts_json_dumps(value):
    expected = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    assert canonical_json(value) == expected


@settings(max_examples=500)
@given(
    st.recursive(
        st.one_of(
            st.none(), st.booleans(), st.integers(-(2**65), 2**65), st.text(st.characters(codec="utf-8"), max_size=8)
        ),
        lambda children: st.one_of(
            st.lists(children, max_size=4),
            st.dictionaries(st.text(st.characters(codec="utf-8"), max_size=3), children, max_size=5),
        ),
        max_leaves=20,
    )
)
def test_canonical_json_of_a_float_free_value_is_the_contracts_json_dumps(value):
    """What orjson writes (no float): any character in keys (sorted by code point,
    U+FFFF before U+10000) and strings, integers past 64 bits (stdlib's then)."""
    expected = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    assert canonical_json(value, float_free=True) == expected


def test_canonical_json_of_a_float_free_value_escapes_as_json_dumps_does():
    for character in [*map(chr, range(128)), "\u2028", "\u2029", "\ufeff", "\uffff", "\U00010000", "é"]:
        value = {character: [character * 2, f"a{character}b"], "k": {character + "x": None}}
        expected = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
        assert canonical_json(value, float_free=True) == expected


def test_canonical_json_of_a_float_free_value_nested_deeper_than_orjson_goes():
    value: list = []
    for _ in range(300):
        value = [value]
    assert canonical_json(value, float_free=True) == json.dumps(value, separators=(",", ":")).encode()


def test_canonical_json_examples():
    assert canonical_json({"b": 1, "a": [1.5e-07, "é", True, None]}) == '{"a":[1.5e-07,"é",true,null],"b":1}'.encode()
    assert canonical_json({"b": {"z": 1, "y": 2}, "a": "☃"}) == '{"a":"☃","b":{"y":2,"z":1}}'.encode()


def test_canonical_json_survives_a_lone_surrogate():
    # json.loads accepts "\ud800"; hashing it must not raise in the middle of a request.
    payload = json.loads('{"a": "\\ud800"}')
    assert canonical_json(payload) == b'{"a":"\xed\xa0\x80"}'
    assert len(payload_sha256(payload)) == 64


def reordered(value):
    """The same JSON value with every object's keys in reverse order."""
    if isinstance(value, dict):
        return {key: reordered(value[key]) for key in reversed(list(value))}
    if isinstance(value, list):
        return [reordered(item) for item in value]
    return value


@settings(max_examples=60)
@given(json_values)
def test_payload_sha256_ignores_key_order_and_whitespace(value):
    compact = json.dumps(value, separators=(",", ":"))
    pretty = json.dumps(reordered(value), indent=3, ensure_ascii=False)
    assert payload_sha256(json.loads(compact)) == payload_sha256(json.loads(pretty))


def test_payload_sha256_of_two_raw_bodies():
    first = b'{"id":"evt_1","data":{"amount":1000,"tags":["a","b"]}}'
    second = b'{\n  "data": {"tags": ["a", "b"],\n "amount": 1000},\r\n\t"id": "evt_1"\n}\n'
    assert payload_sha256(json.loads(first)) == payload_sha256(json.loads(second))


def test_payload_sha256_is_lowercase_hex_of_canonical_json():
    assert payload_sha256({"a": 1}) == "015abd7f5cc57a2dd94b7590f04ad8084273905ee33ec5cebeae62276a97f862"
    assert payload_sha256({"a": 1}) == sha256_hex(b'{"a":1}')


def test_hash_fields_ignore_transient_fields():
    first = {"order": {"id": 7, "total": "9.99"}, "sent_at": "2024-05-01T10:00:00Z", "retry": 0}
    second = {"order": {"id": 7, "total": "9.99"}, "sent_at": "2024-05-01T10:05:00Z", "retry": 3}
    fields = parse_hash_fields(["order"])
    assert payload_sha256(first, fields) == payload_sha256(second, fields)
    assert payload_sha256(first) != payload_sha256(second)
    assert payload_sha256(first, fields) != payload_sha256({**first, "order": {"id": 8}}, fields)


def test_hash_fields_hash_missing_paths_as_null():
    payload = {"a": 1, "items": [{"sku": "S"}], "noise": "x"}
    fields = ("a", "b.c", "items.0.sku", "items.5.sku")
    assert hashed_content(payload, fields) == {"a": 1, "b.c": None, "items.0.sku": "S", "items.5.sku": None}
    expected = b'{"a":1,"b.c":null,"items.0.sku":"S","items.5.sku":null}'
    assert payload_sha256(payload, fields) == sha256_hex(expected)


def test_hash_fields_keep_whole_values_not_just_ids():
    payload = {"data": {"amount": 1.5, "lines": [1, 2]}}
    assert hashed_content(payload, ["data"]) == {"data": {"amount": 1.5, "lines": [1, 2]}}


def test_no_hash_fields_hashes_the_payload_itself():
    payload = {"b": 2, "a": 1}
    assert hashed_content(payload, ()) is payload
    assert payload_sha256(payload, ()) == sha256_hex(b'{"a":1,"b":2}')


def test_parse_hash_fields():
    assert parse_hash_fields(["data.id", "items.0.sku"]) == ("data.id", "items.0.sku")
    assert parse_hash_fields([]) == ()


@pytest.mark.parametrize("paths", [[""], ["a..b"], [".a"], ["a."], ["ok", "a. b"], [3], [["a"]], "data.id"])
def test_parse_hash_fields_rejects_malformed_paths(paths):
    with pytest.raises(SelectorError, match="hash_fields"):
        parse_hash_fields(paths)


def test_fallback_event_id_and_idempotency_key():
    digest = payload_sha256({"a": 1})
    assert fallback_event_id(digest) == f"sha256:{digest}"
    assert idempotency_key("stripe", "evt_1") == "stripe:evt_1"
    assert idempotency_key("paystack", fallback_event_id(digest)) == f"paystack:sha256:{digest}"


# --- resolve never raises ------------------------------------------------------------------------

path_segments = st.one_of(st.text(st.sampled_from("abc012"), min_size=1, max_size=2), st.sampled_from(["0", "1"]))
body_specs = st.lists(path_segments, min_size=1, max_size=3).map(lambda path: "body:" + ".".join(path))
header_specs = st.sampled_from(["header:X-Id", "header:x-id", "header:Webhook-Id"])
template_specs = st.lists(st.one_of(body_specs, header_specs), min_size=1, max_size=3).map(
    lambda specs: "/".join("{" + spec.replace(":", ".", 1) + "}" for spec in specs)
)
selector_specs = st.lists(st.one_of(body_specs, header_specs, template_specs), max_size=4)
header_maps = st.dictionaries(st.sampled_from(["X-Id", "x-id", "webhook-id", "Other"]), st.text(max_size=3))


@settings(max_examples=150)
@given(selector_specs, header_maps, json_values)
def test_resolve_never_raises_and_returns_a_non_empty_string_or_none(specs, headers, payload):
    event_id = resolve_event_id(parse_selectors(specs), CIMultiDict(headers), payload)
    assert event_id is None or (isinstance(event_id, str) and event_id)


@settings(max_examples=60)
@given(json_values, st.lists(st.lists(path_segments, min_size=1, max_size=3).map(".".join), max_size=3))
def test_payload_sha256_never_raises(payload, hash_fields):
    assert len(payload_sha256(payload, parse_hash_fields(hash_fields))) == 64


# -- what the signature covers (issue 36) -------------------------------------------------------


def test_signed_headers_answer_the_signed_value_and_hide_the_unsigned_family():
    sent = CIMultiDict({"webhook-id": "forged", "svix-id": "msg_1", "X-Other": "o"})
    view = event_id.SignedHeaders(sent, {"svix-id": "msg_1", "webhook-id": None})
    selectors = event_id.parse_selectors(["header:webhook-id", "header:Svix-Id"])
    assert event_id.resolve_with(selectors, view, {}) == ("msg_1", selectors[1])
    assert view.get("Webhook-ID") is None and view["x-other"] == "o"


def test_an_id_from_a_header_the_signature_does_not_cover_is_unsigned():
    header, body, template = event_id.parse_selectors(["header:X-GitHub-Delivery", "body:id", "{header.svix-id}:x"])
    assert event_id.reads_unsigned_header(header, {})
    assert not event_id.reads_unsigned_header(body, {})
    assert event_id.reads_unsigned_header(template, {"svix-id": None})
    assert not event_id.reads_unsigned_header(template, {"svix-id": "msg_1"})

"""The sources file (docs/reference.md §3): what loads, and the one line a mistake gives."""

import asyncio
import ipaddress

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from webhook_ingest.shared.broker import topology
from webhook_ingest.shared.errors import ConfigError
from webhook_ingest.shared.sources.model import SourceSection, load_sources, parse_source, resolve_secret

VALID = """
[sources.shop]
scheme = "shopify"
secrets = ["env:SHOP_SECRET", "literal-old"]
handler = "inbox"
retry_delays = [0.5, 2]
max_attempts = 3
hash_fields = ["order.id"]
"""


def load(tmp_path, text):
    path = tmp_path / "sources.toml"
    path.write_text(text)
    return load_sources(str(path))


def test_a_valid_file_loads_with_defaults_and_env_secrets(tmp_path, monkeypatch):
    monkeypatch.setenv("SHOP_SECRET", "from-env")
    [source] = load(tmp_path, VALID).values()
    assert source.secrets == ("from-env", "literal-old")
    assert source.max_body_bytes == 1_048_576 and source.tolerance_seconds == 300
    assert [source.retry_delay(n) for n in (1, 2, 3, 4)] == [0.5, 2, 2, 2]  # the last delay repeats
    assert source.hash_fields == ("order.id",)


def test_the_built_in_demo_source_needs_no_file():
    sources = load_sources(None)
    assert list(sources) == ["demo"] and sources["demo"].handler == "inbox"


@pytest.mark.parametrize(
    "section, field, problem",
    [
        ('scheme = "sha1"\nsecrets = ["s"]\nhandler = "inbox"', "scheme", "unknown scheme"),
        ('scheme = "github"\nhandler = "inbox"', "secrets", "non-empty list"),
        (
            'scheme = "github"\nsecrets = ["env:NOT_SET_ANYWHERE"]\nhandler = "inbox"',
            "secrets[0]",
            "NOT_SET_ANYWHERE is not set",
        ),
        ('scheme = "github"\nsecrets = ["s"]\nhandler = ""', "handler", "non-empty string"),
        ('scheme = "github"\nsecrets = ["s"]\nhandler = "inbox"\nevent_id = ["cookie:x"]', "event_id", ""),
        ('scheme = "github"\nsecrets = ["s"]\nhandler = "inbox"\nevent_id = ["{body.a"]', "event_id", ""),
        ('scheme = "github"\nsecrets = ["s"]\nhandler = "inbox"\nretry_delays = []', "retry_delays", "non-empty"),
        ('scheme = "github"\nsecrets = ["s"]\nhandler = "inbox"\nmax_attempts = 0', "max_attempts", "positive integer"),
        (
            'scheme = "github"\nsecrets = ["s"]\nhandler = "inbox"\nmax_body_bytes = true',
            "max_body_bytes",
            "positive integer",
        ),
        ('scheme = "github"\nsecrets = ["s"]\nhandler = "inbox"\ncolour = "red"', "colour", "unknown field"),
        ('scheme = "standard-webhooks"\nsecrets = ["whsec_"]\nhandler = "inbox"', "secrets", "no key bytes"),
        (
            'scheme = "twilio"\nsecrets = ["t"]\nhandler = "inbox"',
            "public_url",
            "the ingress cannot know behind a proxy",
        ),
        (
            'scheme = "twilio"\nsecrets = ["t"]\nhandler = "inbox"\npublic_url = "https://h/w?x=1"',
            "public_url",
            "query",
        ),
        (
            'scheme = "square"\nsecrets = ["t"]\nhandler = "inbox"\npublic_url = 7',
            "public_url",
            "the URL the provider calls",
        ),
        (
            'scheme = "github"\nsecrets = ["s"]\nhandler = "inbox"\npublic_url = "https://h/w"',
            "public_url",
            "only square and twilio",
        ),
        ('scheme = "api-key"\nsecrets = ["k"]\nhandler = "inbox"', "signature_header", "X-API-Key"),
        ('scheme = "basic-auth"\nsecrets = ["nocolon"]\nhandler = "inbox"', "secrets", "username:password"),
        ('scheme = "standard-webhooks-v1a"\nsecrets = ["whsk_AAAA"]\nhandler = "inbox"', "secrets", "private key"),
    ],
)
def test_each_mistake_is_one_line_naming_the_source_and_the_field(tmp_path, section, field, problem):
    with pytest.raises(ConfigError) as raised:
        load(tmp_path, f"[sources.acme]\n{section}\n")
    message = str(raised.value)
    assert message.startswith(f"source 'acme': {field}: ")
    assert problem in message and "\n" not in message


def test_a_twilio_source_keeps_its_public_url_and_an_api_key_source_its_header(tmp_path):
    sources = load(
        tmp_path,
        """
[sources.sms]
scheme = "twilio"
secrets = ["token"]
handler = "inbox"
public_url = "https://hooks.example.com/webhooks/sms"

[sources.crm]
scheme = "api-key"
secrets = ["key"]
handler = "inbox"
signature_header = "X-CRM-Key"
""",
    )
    assert sources["sms"].public_url == "https://hooks.example.com/webhooks/sms"
    assert sources["crm"].verifier.credential_header == "X-CRM-Key"  # type: ignore[attr-defined]


def test_a_handler_is_only_a_name_to_the_sources_file(tmp_path):
    """The ingress loads this file too, and never imports handler code."""
    [source] = load(
        tmp_path, '[sources.acme]\nscheme = "github"\nsecrets = ["s"]\nhandler = "no_such_module_xyz:handle"\n'
    ).values()
    assert source.handler == "no_such_module_xyz:handle"


@pytest.mark.parametrize(
    "text, problem",
    [
        ("[sources.a\n", "invalid TOML"),
        ("[other]\nx = 1\n", r"no \[sources\.NAME\] section"),
    ],
)
def test_a_broken_file_names_the_file(tmp_path, text, problem):
    with pytest.raises(ConfigError, match=problem):
        load(tmp_path, text)


def test_a_missing_file_names_the_path(tmp_path):
    with pytest.raises(ConfigError, match=r"nowhere\.toml"):
        load_sources(str(tmp_path / "nowhere.toml"))


def test_file_secrets_read_the_file_without_its_trailing_newline(tmp_path):
    secret_file = tmp_path / "github_secret"
    secret_file.write_text("from-a-file\n")
    [source] = load(
        tmp_path, f'[sources.gh]\nscheme = "github"\nsecrets = ["file:{secret_file}"]\nhandler = "inbox"\n'
    ).values()
    assert source.secrets == ("from-a-file",)


@pytest.mark.parametrize("content, problem", [(None, "cannot read secret file"), ("", "is empty"), ("\n", "is empty")])
def test_an_unusable_secret_file_is_a_start_up_error_naming_source_and_field(tmp_path, content, problem):
    secret_file = tmp_path / "secret"
    if content is not None:
        secret_file.write_text(content)
    with pytest.raises(ConfigError) as raised:
        load(tmp_path, f'[sources.gh]\nscheme = "github"\nsecrets = ["s", "file:{secret_file}"]\nhandler = "inbox"\n')
    assert str(raised.value).startswith("source 'gh': secrets[1]: ") and problem in str(raised.value)


def test_allowed_ips_and_rate_limit_load_as_networks_and_a_bucket(tmp_path):
    [source] = load(
        tmp_path,
        '[sources.gh]\nscheme = "github"\nsecrets = ["s"]\nhandler = "inbox"\n'
        'allowed_ips = ["192.30.252.0/22", "2001:db8::/32", "127.0.0.1"]\n'
        "rate_limit = { per_second = 0.5, burst = 3 }\n",
    ).values()
    assert [str(n) for n in source.allowed_ips] == ["192.30.252.0/22", "2001:db8::/32", "127.0.0.1/32"]
    assert (source.rate_limit.per_second, source.rate_limit.burst) == (0.5, 3)
    assert load_sources(None)["demo"].allowed_ips == () and load_sources(None)["demo"].rate_limit is None


@pytest.mark.parametrize(
    "line, field, problem",
    [
        ('allowed_ips = ["10.0.0.1/8"]', "allowed_ips[0]", "host bits set"),
        ('allowed_ips = ["github"]', "allowed_ips[0]", "CIDR"),
        ('allowed_ips = "10.0.0.0/8"', "allowed_ips", "list of CIDRs"),
        ("rate_limit = { per_second = 0, burst = 1 }", "rate_limit.per_second", "positive number"),
        ("rate_limit = { per_second = 5 }", "rate_limit.burst", "is required"),
        ("rate_limit = { per_second = 5, burst = 1, window = 3 }", "rate_limit.window", "unknown field"),
        ("rate_limit = 5", "rate_limit", "must be a table"),
    ],
)
def test_allowlist_and_rate_limit_mistakes_name_the_field(tmp_path, line, field, problem):
    with pytest.raises(ConfigError) as raised:
        load(tmp_path, f'[sources.acme]\nscheme = "github"\nsecrets = ["s"]\nhandler = "inbox"\n{line}\n')
    assert str(raised.value).startswith(f"source 'acme': {field}: ") and problem in str(raised.value)


# Property-based: whatever a file says, the answer is a loaded source or one
# line naming the source and a field, and never the secret itself.

SECRET = st.text(alphabet="ABCDEFGHJKLMNPQRSTUVWXYZ23456789", min_size=12, max_size=24).map(lambda s: "zz" + s)
OPTIONAL_VALUES = {
    "tolerance_seconds": st.one_of(
        st.integers(-5, 10_000), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=3), st.booleans()
    ),
    "max_body_bytes": st.one_of(st.integers(-5, 10**9), st.floats(allow_nan=False), st.booleans(), st.text(max_size=3)),
    "max_attempts": st.one_of(st.integers(-5, 100), st.booleans(), st.none().map(lambda _: [1])),
    "retry_delays": st.lists(st.one_of(st.integers(-2, 600), st.floats(-1, 600)), max_size=4),
    "fallback_hash": st.one_of(st.booleans(), st.integers(0, 1), st.text(max_size=3)),
    "allowed_ips": st.lists(st.one_of(st.ip_addresses().map(str), st.text(max_size=8)), max_size=3),
    "rate_limit": st.fixed_dictionaries(
        {
            "per_second": st.one_of(st.floats(-1, 1e4), st.integers(-1, 10**4)),
            "burst": st.one_of(st.integers(-1, 10**4), st.booleans()),
        }
    ),
}


@settings(max_examples=200, deadline=None)
@given(
    secret=SECRET,
    overrides=st.dictionaries(st.sampled_from(sorted(OPTIONAL_VALUES)), st.none(), max_size=4).flatmap(
        lambda keys: st.fixed_dictionaries({k: OPTIONAL_VALUES[k] for k in keys})
    ),
    stray=st.one_of(st.none(), st.from_regex(r"\A[a-z_]{1,12}\Z")),
)
def test_any_section_loads_or_fails_with_one_secret_free_line(secret, overrides, stray):
    section = {"scheme": "github", "secrets": [secret], "handler": "inbox", **overrides}
    if stray is not None and stray not in SourceSection.model_fields:
        section[stray] = secret  # an unknown field holding a secret must not echo it either
    try:
        source = parse_source("acme", section)
    except ConfigError as exc:
        message = str(exc)
        assert message.startswith("source 'acme': ") and "\n" not in message
        field_path = message.split(": ")[1]
        assert field_path.split("[")[0].split(".")[0] in {*SourceSection.model_fields, stray}
        assert secret not in message
    else:
        assert source.secrets == (secret,)
        for name, value in overrides.items():
            if name == "allowed_ips":
                assert [ipaddress.ip_network(v) for v in value] == list(source.allowed_ips)
            elif name == "rate_limit":
                assert (source.rate_limit.per_second, source.rate_limit.burst) == (value["per_second"], value["burst"])
            elif name == "retry_delays":
                assert source.retry_delays == tuple(float(v) for v in value)
            else:
                assert getattr(source, name) == value


@settings(max_examples=100, deadline=None)
@given(content=st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"), min_size=1))
def test_a_file_secret_is_the_file_content_minus_one_trailing_newline(tmp_path_factory, content):
    secret_file = tmp_path_factory.mktemp("secret") / "value"
    secret_file.write_text(content + "\n", encoding="utf-8", newline="")
    assert resolve_secret(f"file:{secret_file}") == content


# -- values the broker would refuse later --------------------------------------------

BROKER_MESSAGE_BYTES = 128 * 1024 * 1024  # RabbitMQ's default max_message_size (3.8 to 3.13)


@settings(max_examples=100, deadline=None)
@given(
    max_body_bytes=st.one_of(
        st.integers(1, BROKER_MESSAGE_BYTES - 1024 * 1024), st.integers(BROKER_MESSAGE_BYTES + 1, 2**63)
    )
)
def test_a_body_limit_beyond_one_broker_message_stops_start_up(max_body_bytes):
    section = {"scheme": "github", "secrets": ["s"], "handler": "inbox", "max_body_bytes": max_body_bytes}
    if max_body_bytes < BROKER_MESSAGE_BYTES:
        assert parse_source("acme", section).max_body_bytes == max_body_bytes
        return
    with pytest.raises(ConfigError) as raised:
        parse_source("acme", section)
    assert str(raised.value).startswith("source 'acme': max_body_bytes: ") and "\n" not in str(raised.value)


class _RecordingChannel:
    """Records each retry queue's declaration: name -> its arguments."""

    def __init__(self):
        self.declared: dict[str, list[dict]] = {}

    async def declare_queue(self, name, durable, arguments):
        self.declared.setdefault(name, []).append(arguments)


def _declared_retry_queues(*delays: float) -> dict[str, list[dict]]:
    channel = _RecordingChannel()
    for delay in sorted(set(delays)):  # as a worker declares them (workers/worker.py)
        asyncio.run(topology.declare_retry_queue(channel, "ns", delay))
    return channel.declared


_DELAYS = st.floats(min_value=0.001, max_value=1e7, allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@example(delays=[123456.7, 123457.2])
@example(delays=[1.0000001, 1.0000002])
@given(
    delays=st.one_of(
        st.lists(_DELAYS, min_size=1, max_size=6),
        _DELAYS.flatmap(
            lambda delay: st.lists(st.floats(0, delay * 1e-5).map(lambda step: delay + step), min_size=2, max_size=4)
        ),
    )
)
def test_retry_delays_that_share_a_queue_share_its_delay(delays):
    """Any retry delays of a sources file (and of every source in it: the
    retry queues are per namespace): one queue name, one declaration."""
    sources = {
        "acme": parse_source("acme", {"scheme": "github", "secrets": ["s"], "handler": "inbox", "retry_delays": delays})
    }
    declared = _declared_retry_queues(*(d for source in sources.values() for d in source.retry_delays))
    assert {name: arguments for name, arguments in declared.items() if len(arguments) > 1} == {}


@settings(max_examples=300, deadline=None)
@given(digits=st.integers(1, 999_999), decimals=st.integers(0, 6))
def test_a_delay_of_up_to_six_significant_digits_keeps_its_queue_name(digits, decimals):
    """The names existing deployments have: `10s`, `0.5s`, `300s`."""
    delay = digits / 10**decimals
    assert topology.retry_queue("ns", delay) == f"ns.retry.{delay:g}s"

"""Who the client is behind proxies (ingress/client_address.py), as pure
logic: the hops and the forwarding headers, the key the per-client bounds
count by, the protocol the proxies recorded."""

from ipaddress import IPv6Address, ip_address, ip_network

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st
from multidict import CIMultiDict, CIMultiDictProxy

from webhook_ingest.ingress.client_address import (
    client_key,
    client_of,
    forwarded_for,
    forwarded_proto,
    parse_address,
    resolve_client,
)
from webhook_ingest.shared.errors import ConfigError
from webhook_ingest.shared.settings import load_settings

TRUSTED = (ip_network("10.0.0.0/8"), ip_network("fd00::/8"))
trusted_ips = st.one_of(st.ip_addresses(network="10.0.0.0/8"), st.ip_addresses(network="fd00::/8"))
public_ips = st.one_of(st.ip_addresses(network="203.0.113.0/24"), st.ip_addresses(network="2001:db8::/32"))


def hop_text(address, with_port: bool) -> str:
    if not with_port:
        return str(address)
    return f"[{address}]:443" if address.version == 6 else f"{address}:443"


@given(address=st.ip_addresses(), with_port=st.booleans())
def test_a_hop_parses_with_or_without_a_port(address, with_port):
    assert parse_address(hop_text(address, with_port)) == (
        address.ipv4_mapped or address if address.version == 6 else address
    )


@given(junk=st.sampled_from(["unknown", "_hidden", "", "example.com", "1.2.3", "[::1", "999.1.1.1"]))
def test_junk_is_no_address(junk):
    assert parse_address(junk) is None


@given(peer=public_ips, hops=st.lists(st.one_of(public_ips.map(str), trusted_ips.map(str), st.text(max_size=5))))
def test_an_untrusted_peer_is_the_client_whatever_it_says(peer, hops):
    assert resolve_client(peer, hops, TRUSTED) == peer


@given(
    peer=trusted_ips,
    client=public_ips,
    spoofed=st.lists(public_ips.map(str), max_size=3),
    proxies=st.lists(trusted_ips, max_size=3),
    with_port=st.booleans(),
)
def test_behind_trusted_proxies_the_client_is_the_rightmost_untrusted_hop(peer, client, spoofed, proxies, with_port):
    # Whatever the client wrote itself (spoofed) stays left of what the proxies recorded.
    hops = [*spoofed, hop_text(client, with_port), *(hop_text(p, with_port) for p in proxies)]
    assert resolve_client(peer, hops, TRUSTED) == client


@given(peer=trusted_ips, proxies=st.lists(trusted_ips, min_size=1, max_size=3))
def test_a_junk_hop_ends_the_walk_at_the_last_trusted_address(peer, proxies):
    hops = ["203.0.113.9", "garbage", *map(str, proxies)]
    assert resolve_client(peer, hops, TRUSTED) == proxies[0]


def test_no_peer_address_is_no_client():
    assert resolve_client(None, ["203.0.113.9"], TRUSTED) is None
    assert parse_address("::ffff:127.0.0.1") == ip_address("127.0.0.1")


# -- the forwarding header, as the two kinds of proxy write it ------------------------------------------------------

XFF, FORWARDED = "X-Forwarded-For", "Forwarded"
# What a client writes itself: anything, with the characters that confuse a parser made likely.
client_text = st.lists(
    st.sampled_from([*'",;=\\[]: ', "for", "by", "10.1.2.3", "::1", "unknown", "a"]), max_size=15
).map("".join)
client_headers = st.lists(st.tuples(st.sampled_from([XFF, FORWARDED]), client_text), max_size=3)


def forwarded_element(address, with_port: bool) -> str:
    """What a `Forwarded`-managing proxy appends (RFC 7239: IPv6 and ports quoted)."""
    node = f"[{address}]" if address.version == 6 else str(address)
    port = ":443" if with_port else ""
    return f'for="{node}{port}"' if address.version == 6 or with_port else f"for={node}"


def appended(headers: list[tuple[str, str]], name: str, entry: str, same_line: bool) -> CIMultiDict:
    """`headers` after a proxy appended `entry` to `name`: to its last line
    (`, entry`), as nginx's `$proxy_add_x_forwarded_for` does, or as a line of its own."""
    result = CIMultiDict(headers)
    lines = result.getall(name, [])
    if same_line and lines:
        result.popall(name)
        for line in lines[:-1]:
            result.add(name, line)
        result.add(name, f"{lines[-1]}, {entry}")
    else:
        result.add(name, entry)
    return result


@given(
    client=public_ips,
    own=client_headers,
    proxies=st.lists(trusted_ips, min_size=1, max_size=3),
    same_line=st.booleans(),
    with_port=st.booleans(),
)
def test_behind_x_forwarded_for_proxies_a_clients_own_headers_change_nothing(
    client, own, proxies, same_line, with_port
):
    # Each proxy appends the address it was connected from; the last one is the peer.
    headers, sender = CIMultiDict(own), client
    for proxy in proxies:
        headers = appended(list(headers.items()), XFF, hop_text(sender, with_port=False), same_line)
        sender = proxy
    assert client_of(sender, CIMultiDictProxy(headers), XFF, TRUSTED) == client


@given(
    client=public_ips,
    own=client_headers,
    proxies=st.lists(trusted_ips, min_size=1, max_size=3),
    same_line=st.booleans(),
    with_port=st.booleans(),
)
@example(
    client=ip_address("2001:db8::9"),
    own=[(FORWARDED, 'for=10.1.2.3;x="')],
    proxies=[ip_address("10.0.0.1")],
    same_line=True,
    with_port=False,
)
def test_behind_forwarded_proxies_a_clients_own_headers_change_nothing(client, own, proxies, same_line, with_port):
    headers, sender = CIMultiDict(own), client
    for proxy in proxies:
        headers = appended(
            list(headers.items()), FORWARDED, forwarded_element(sender, with_port) + ";proto=https", same_line
        )
        sender = proxy
    assert client_of(sender, CIMultiDictProxy(headers), FORWARDED, TRUSTED) == client


def test_the_issue_21_spoof_through_an_x_forwarded_for_proxy():
    headers = CIMultiDictProxy(CIMultiDict({FORWARDED: "for=10.1.2.3", XFF: "203.0.113.9"}))
    assert client_of(ip_address("10.0.0.1"), headers, XFF, TRUSTED) == ip_address("203.0.113.9")


def test_an_unbalanced_quote_does_not_swallow_the_proxys_forwarded_element():
    # aiohttp's request.forwarded reads this line as one element, for=10.1.2.3.
    headers = CIMultiDictProxy(CIMultiDict({FORWARDED: 'for=10.1.2.3;x=", for="[2001:db8::9]"'}))
    assert client_of(ip_address("10.0.0.1"), headers, FORWARDED, TRUSTED) == ip_address("2001:db8::9")


@given(element=client_text, address=st.ip_addresses(), with_port=st.booleans())
def test_the_for_pair_is_found_whatever_else_the_element_holds(element, address, with_port):
    pairs = [pair for pair in element.split(";") if pair.partition("=")[0].strip().lower() != "for"]
    hop = forwarded_for(";".join(["by=x", *pairs, forwarded_element(address, with_port), "proto=https"]))
    assert parse_address(hop) == (address.ipv4_mapped or address if address.version == 6 else address)


def test_the_client_address_header_is_one_of_two_and_read_case_insensitively(monkeypatch):
    monkeypatch.setenv("WEBHOOK_INGEST_CLIENT_ADDRESS_HEADER", "forwarded")
    assert load_settings().client_address_header == "Forwarded"
    monkeypatch.delenv("WEBHOOK_INGEST_CLIENT_ADDRESS_HEADER")
    assert load_settings().client_address_header == "X-Forwarded-For"
    monkeypatch.setenv("WEBHOOK_INGEST_CLIENT_ADDRESS_HEADER", "X-Real-IP")
    with pytest.raises(ConfigError, match="WEBHOOK_INGEST_CLIENT_ADDRESS_HEADER"):
        load_settings()


# What the per-client bounds count by (ingress/client_address.client_key): an
# IPv4 address, an IPv6 address's /64 — one subscriber, however many of its
# 2^64 addresses it sends from.

v6 = st.ip_addresses(v=6).filter(lambda address: address.ipv4_mapped is None)


@given(address=v6, host=st.integers(min_value=0, max_value=2**64 - 1))
def test_every_address_of_one_ipv6_slash_64_is_one_client(address, host):
    neighbour = IPv6Address((int(address) >> 64 << 64) | host)
    assume(neighbour.ipv4_mapped is None)  # ::ffff:0:0/96, inside ::/64, is IPv4 seen through a dual-stack socket
    assert client_key(str(address)) == client_key(str(neighbour)) == client_key(f"[{neighbour}]:443")


@given(first=v6, second=v6)
def test_addresses_of_two_ipv6_slash_64s_are_two_clients(first, second):
    assert (client_key(str(first)) == client_key(str(second))) == (int(first) >> 64 == int(second) >> 64)


@given(address=st.ip_addresses(v=4))
def test_an_ipv4_client_is_its_address_also_seen_through_a_dual_stack_socket(address):
    assert client_key(str(address)) == client_key(f"::ffff:{address}") == str(address)
    assert client_key(str(ip_address(int(address) ^ 1))) != str(address)


def test_what_is_no_address_is_counted_as_it_is():
    assert client_key(None) == "None" and client_key("unix-socket") == "unix-socket"


# The protocol a client used, as the proxies that manage `Forwarded` recorded
# it (the console's Secure cookie): whatever the client wrote itself, to the
# left of what the proxies appended, changes nothing.

TRUSTED_V4 = (ip_network("10.0.0.0/8"),)
trusted_v4_ips = st.ip_addresses(network="10.0.0.0/8")
client_ips = st.ip_addresses(network="203.0.113.0/24")
protos = st.sampled_from(["http", "https", "HTTPS", '"https"'])
# What a client may write in its own Forwarded lines: quotes, commas, semicolons, other protos.
own_lines = st.lists(st.text(alphabet='for=proto;,"htps 1.0203:[]', max_size=40), max_size=3)


@given(
    own=own_lines,
    client=client_ips,
    edge_proto=protos,
    proxies=st.lists(trusted_v4_ips, min_size=1, max_size=3),
    inner_proto=protos,
    same_line=st.booleans(),
)
@example(
    own=['for=10.1.2.3;proto=http;x="'],
    client=ip_address("203.0.113.9"),
    edge_proto="https",
    proxies=[ip_address("10.0.0.1")],
    inner_proto="http",
    same_line=True,
)
def test_the_proto_is_the_outermost_trusted_proxys(own, client, edge_proto, proxies, inner_proto, same_line):
    # The first proxy saw the client over `edge_proto`; each one after it saw the one before over `inner_proto`.
    elements, sender = [], client
    for n, proxy in enumerate(proxies):
        elements.append(f"for={sender};proto={edge_proto if n == 0 else inner_proto}")
        sender = proxy
    headers = CIMultiDict(("Forwarded", line) for line in own)
    if same_line and own:
        headers.popall("Forwarded")
        for line in own[:-1]:
            headers.add("Forwarded", line)
        headers.add("Forwarded", ", ".join([own[-1], *elements]))
    else:
        headers.add("Forwarded", ", ".join(elements))
    assert forwarded_proto(sender, CIMultiDictProxy(headers), TRUSTED_V4) == edge_proto.strip('"')


@given(own=own_lines)
def test_from_a_peer_outside_the_trusted_proxies_no_proto_is_read(own):
    headers = CIMultiDictProxy(CIMultiDict(("Forwarded", line) for line in [*own, "for=10.0.0.1;proto=https"]))
    assert forwarded_proto(ip_address("203.0.113.9"), headers, TRUSTED_V4) == ""

"""What the per-client bounds count by (ingress/client_address.client_key): an
IPv4 address, an IPv6 address's /64 — one subscriber, however many of its
2^64 addresses it sends from."""

from ipaddress import IPv6Address, ip_address

from hypothesis import assume, given
from hypothesis import strategies as st

from webhook_ingest.ingress.client_address import client_key

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

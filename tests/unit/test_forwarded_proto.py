"""The protocol a client used, as the proxies that manage `Forwarded` recorded
it (the console's Secure cookie): whatever the client wrote itself, to the
left of what the proxies appended, changes nothing."""

from ipaddress import ip_address, ip_network

from hypothesis import example, given
from hypothesis import strategies as st
from multidict import CIMultiDict, CIMultiDictProxy

from webhook_ingest.ingress.client_address import forwarded_proto

TRUSTED = (ip_network("10.0.0.0/8"),)
trusted_ips = st.ip_addresses(network="10.0.0.0/8")
client_ips = st.ip_addresses(network="203.0.113.0/24")
protos = st.sampled_from(["http", "https", "HTTPS", '"https"'])
# What a client may write in its own Forwarded lines: quotes, commas, semicolons, other protos.
own_lines = st.lists(st.text(alphabet='for=proto;,"htps 1.0203:[]', max_size=40), max_size=3)


@given(
    own=own_lines,
    client=client_ips,
    edge_proto=protos,
    proxies=st.lists(trusted_ips, min_size=1, max_size=3),
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
    assert forwarded_proto(sender, CIMultiDictProxy(headers), TRUSTED) == edge_proto.strip('"')


@given(own=own_lines)
def test_from_a_peer_outside_the_trusted_proxies_no_proto_is_read(own):
    headers = CIMultiDictProxy(CIMultiDict(("Forwarded", line) for line in [*own, "for=10.0.0.1;proto=https"]))
    assert forwarded_proto(ip_address("203.0.113.9"), headers, TRUSTED) == ""

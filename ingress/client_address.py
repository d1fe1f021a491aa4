"""Who is the client: the TCP peer, or — only when that peer is one of
`WEBHOOK_INGEST_TRUSTED_PROXIES` — the address those proxies recorded in
the one header they manage (`WEBHOOK_INGEST_CLIENT_ADDRESS_HEADER`:
`X-Forwarded-For`, or `Forwarded` of RFC 7239). The other header is never
read: nginx, ingress-nginx and ALB append to `X-Forwarded-For` and pass a
client's own `Forwarded` through untouched, so reading whichever is present
let a client pick its address. The allowlists, the rate limits, the sign-in
throttle and the logs all read the result as `request.remote`.

Why not aiohttp-remotes (1.4, maintained, works with our aiohttp): its
`XForwardedStrict`/`ForwardedStrict` need an exact hop count and answer 400 to
a direct client or an untrusted peer, and `XForwardedFiltered` believes the
header from any peer, so anyone could pick an allowlisted address. We need
"a trusted peer: walk the chain from the right past trusted proxies; anyone
else: the headers are ignored", which is the few lines below.

Why `Forwarded` is not read through aiohttp's `request.forwarded`: it parses
from the left, so a client's unbalanced quote (`for=10.1.2.3;x="`) swallows
the element a proxy appended after it on the same line, and the client's
own `for=` becomes the rightmost hop. Only the right end of the header is
the proxies'; we split it on commas and semicolons, which their elements
(addresses, never quoted commas) survive, and whatever the client wrote
stays to the left or is junk that ends the walk.
"""

import functools
from collections.abc import Iterable, Sequence
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address

from aiohttp import hdrs, web
from multidict import CIMultiDictProxy

Address = IPv4Address | IPv6Address
Network = IPv4Network | IPv6Network
IPV6_CLIENT_PREFIX = 64  # a subscriber's smallest IPv6 network (RFC 6177)


def parse_address(text: str | None) -> Address | None:
    """An address from a peer name or a header hop (`1.2.3.4`, `1.2.3.4:80`,
    `[2001:db8::1]:80`); None for `unknown`, obfuscated ids and junk.
    IPv4-mapped IPv6 (a dual-stack socket's view) becomes plain IPv4."""
    if not text:
        return None
    text = text.strip().strip('"')
    if text.startswith("["):
        text, bracket, _ = text[1:].partition("]")
        if not bracket:
            return None
    elif text.count(":") == 1:
        text = text.partition(":")[0]
    try:
        address = ip_address(text)
    except ValueError:
        return None
    if isinstance(address, IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


@functools.lru_cache(maxsize=4096)  # twice per request (failure budget, slots), 8 µs each parsed afresh
def client_key(client: str | None) -> str:
    """What the per-client bounds count by (the failure budget, the bodies
    arriving, the sign-in throttle): an IPv4 address, or an IPv6 address's
    /64. Anyone with IPv6 is given a /64 at least and may send from any of
    its 2^64 addresses: counted per address, no bound ever refused one such client."""
    address = parse_address(client)
    if isinstance(address, IPv6Address):
        return str(IPv6Network((address, IPV6_CLIENT_PREFIX), strict=False))
    return str(client if address is None else address)


def is_within(address: Address | None, networks: Iterable[Network]) -> bool:
    # `in` across IP versions is simply False, so one list serves both.
    return address is not None and any(address in network for network in networks)


def resolve_client(peer: Address | None, hops: Sequence[str], trusted: Sequence[Network]) -> Address | None:
    """The client address; `hops` are the forwarding header's entries,
    leftmost (the original client) first. Walking from the right, each
    trusted hop vouches for the one before it; the first untrusted one is
    the client. A hop that is not an address ends the walk at the last
    address we can vouch for."""
    address = peer
    for hop in reversed(hops):
        if not is_within(address, trusted):
            break
        forwarded = parse_address(hop)
        if forwarded is None:
            break
        address = forwarded
    return address


def forwarding_hops(headers: CIMultiDictProxy[str], header: str) -> list[str]:
    """The entries of `header` (one of settings.CLIENT_ADDRESS_HEADERS),
    leftmost first, over all its lines in order."""
    lines = headers.getall(header, ())
    if header == hdrs.FORWARDED:
        return [forwarded_for(element) for line in lines for element in line.split(",")]
    return [hop for line in lines for hop in line.split(",")]


def forwarded_for(element: str) -> str:
    """The `for=` of one `Forwarded` element; "" (junk) when it has none."""
    return forwarded_parameter(element, "for")


def forwarded_parameter(element: str, wanted: str) -> str:
    """The value of the parameter `wanted` (lower case) of one `Forwarded` element, as written; "" when absent."""
    for pair in element.split(";"):
        name, equals, value = pair.partition("=")
        if equals and name.strip().lower() == wanted:
            return value
    return ""


def forwarded_proto(peer: Address | None, headers: CIMultiDictProxy[str], trusted: Sequence[Network]) -> str:
    """The `proto=` of `Forwarded` that the outermost trusted proxy wrote, walking
    from the right as `resolve_client` does (the leftmost element may be the
    client's own); "" when no trusted proxy wrote one."""
    proto, address = "", peer
    for element in reversed([element for line in headers.getall(hdrs.FORWARDED, ()) for element in line.split(",")]):
        if not is_within(address, trusted):
            break
        proto = forwarded_parameter(element, "proto").strip().strip('"')
        address = parse_address(forwarded_for(element))
    return proto


def client_of(
    peer: Address | None, headers: CIMultiDictProxy[str], header: str, trusted: Sequence[Network]
) -> Address | None:
    """The client of a request from `peer` carrying `headers`."""
    if not is_within(peer, trusted):
        return peer
    return resolve_client(peer, forwarding_hops(headers, header), trusted)


def setup_client_address(app: web.Application, trusted: Sequence[Network], header: str) -> None:
    """With no trusted proxy configured nothing is installed: requests pay nothing."""
    if trusted:
        app.middlewares.append(_forwarded_client(tuple(trusted), header))


def _forwarded_client(trusted: tuple[Network, ...], header: str):
    @web.middleware
    async def forwarded_client(request: web.Request, handler):
        peer = parse_address(request.remote)
        if is_within(peer, trusted):
            client = client_of(peer, request.headers, header, trusted)
            if client is not None and client != peer:
                request = request.clone(remote=str(client))
        return await handler(request)

    return forwarded_client

"""Who is the client: the TCP peer, or — only when that peer is one of
`WEBHOOK_INGEST_TRUSTED_PROXIES` — the address the proxies recorded in
`Forwarded` (RFC 7239) or `X-Forwarded-For`. The allowlists, the rate limits
and the logs all read the result as `request.remote`.

Why not aiohttp-remotes (1.4, maintained, works with our aiohttp): its
`XForwardedStrict`/`ForwardedStrict` need an exact hop count and answer 400 to
a direct client or an untrusted peer, and `XForwardedFiltered` believes the
header from any peer, so anyone could pick an allowlisted address. We need
"a trusted peer: walk the chain from the right past trusted proxies; anyone
else: the headers are ignored", which is the few lines below. `Forwarded`
itself is parsed by aiohttp (`request.forwarded`), not by hand.
"""

from collections.abc import Iterable, Sequence
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address

from aiohttp import hdrs, web

Address = IPv4Address | IPv6Address
Network = IPv4Network | IPv6Network


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


def forwarding_hops(request: web.Request) -> list[str]:
    """`Forwarded: for=…` when present (the standard), else `X-Forwarded-For`."""
    if hdrs.FORWARDED in request.headers:
        return [element.get("for") or "unknown" for element in request.forwarded]
    return [hop for header in request.headers.getall(hdrs.X_FORWARDED_FOR, ()) for hop in header.split(",")]


def setup_client_address(app: web.Application, trusted: Sequence[Network]) -> None:
    """With no trusted proxy configured nothing is installed: requests pay nothing."""
    if trusted:
        app.middlewares.append(_forwarded_client(tuple(trusted)))


def _forwarded_client(trusted: tuple[Network, ...]):
    @web.middleware
    async def forwarded_client(request: web.Request, handler):
        peer = parse_address(request.remote)
        if is_within(peer, trusted):
            client = resolve_client(peer, forwarding_hops(request), trusted)
            if client is not None and client != peer:
                request = request.clone(remote=str(client))
        return await handler(request)

    return forwarded_client

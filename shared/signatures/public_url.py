"""The URL a provider calls, as the source states it: twilio and square sign it.

Behind a proxy or a load balancer the ingress sees its own host, port and
scheme, not the ones the provider used, so the URL cannot be rebuilt from
the request: the sources file says it (`public_url`), exactly as it is set
at the provider.
"""

from urllib.parse import urlsplit

from .errors import SchemeConfigError


def checked(public_url: str | None, scheme: str, *, query_allowed: bool) -> str:
    if not public_url:
        raise SchemeConfigError(
            f"the {scheme} scheme signs the URL it calls, which the ingress cannot know behind a"
            f' proxy: set public_url = "https://…/webhooks/NAME" as configured at {scheme}',
            field="public_url",
        )
    try:
        parts = urlsplit(public_url)
        parts.port  # noqa: B018  # raises ValueError for a port that is not a number
    except ValueError as exc:
        raise SchemeConfigError(f"not a URL: {exc}", field="public_url") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SchemeConfigError("must be an absolute http:// or https:// URL", field="public_url")
    if parts.fragment or public_url.endswith("#"):
        raise SchemeConfigError("must not have a #fragment: it is never sent, so never signed", field="public_url")
    if not query_allowed and (parts.query or "?" in public_url):
        raise SchemeConfigError(
            f"must not have a ?query: {scheme} signs the query of each request, which the ingress appends as received",
            field="public_url",
        )
    return public_url


def with_and_without_port(public_url: str) -> tuple[str, str]:
    """The URL as written and with its default port added or removed, as twilio's RequestValidator
    tries both (Twilio's own signing is inconsistent about the port)."""
    parts = urlsplit(public_url)
    host = parts.netloc.rpartition("@")[2]
    userinfo = parts.netloc[: len(parts.netloc) - len(host)]
    if parts.port:
        other = parts._replace(netloc=userinfo + host.rsplit(":", 1)[0])
    else:
        other = parts._replace(netloc=f"{parts.netloc}:{443 if parts.scheme == 'https' else 80}")
    return parts.geturl(), other.geturl()

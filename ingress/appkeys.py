"""Typed keys of the ingress application's shared resources."""

from aiohttp import web

from webhook_ingest.ingress.publisher import Publisher
from webhook_ingest.shared.settings import Settings
from webhook_ingest.shared.sources import Source

settings_key = web.AppKey("settings", Settings)
sources_key = web.AppKey("sources", dict[str, Source])
publisher_key = web.AppKey("publisher", Publisher)

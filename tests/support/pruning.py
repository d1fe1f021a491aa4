"""The calendar of the tests that prune ended replays' items
(shared/upkeep.py; docs/design.md, "Replay items pruned"): events
archived yesterday, whose day a 7-day retention drops a week on, while
today's stay; and the one source they come from."""

from datetime import UTC, datetime, time, timedelta

from webhook_ingest.shared.sources.model import parse_source

NOW = datetime.now(UTC)
MIDNIGHT = datetime.combine(NOW.date(), time(), UTC)
YESTERDAY = MIDNIGHT - timedelta(hours=6)  # the day the retention drops below
TOMORROW = MIDNIGHT + timedelta(days=1, hours=6)
A_WEEK_ON = NOW + timedelta(days=7)  # the oldest day kept is today: yesterday goes
DAY = 86400.0
SOURCES = {"acme": parse_source("acme", {"scheme": "github", "secrets": ["s"], "handler": "inbox"})}

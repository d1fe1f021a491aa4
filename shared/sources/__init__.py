"""webhook_ingest.shared.sources: what each of its modules holds.

- model         The sources file (docs/reference.md §3): one section per webhook provider endpoint.
- routes        A source's routes (docs/reference.md §3 `routes`; why: docs/design.md, "Routes")
- ordering      A source's or a route's `ordering`: which events of it run one after another, in lanes.
- lanes         Where an event of an ordered source goes: a row per lane, and what is still published.
- ignore_rules  A source's `ignore` rules (docs/reference.md §3)
- pauses        Paused sources (docs/reference.md §8.3)
- retention     A source's `retention` (docs/reference.md §3): how long the archive keeps its events.
"""

from typing import TYPE_CHECKING, Any

from .model import Source, load_sources, resolve_secret
from .ordering import OrderingRule
from .routes import route_key

__all__ = ["Laned", "OrderingRule", "PauseStore", "Source", "laned", "load_sources", "resolve_secret", "route_key"]

if TYPE_CHECKING:
    from .lanes import Laned, laned
    from .pauses import PauseStore


def __getattr__(name: str) -> Any:
    """The pause store (and the audit log and Postgres below it) and the lanes (ordering keys'
    rows) load on first use: the CLI and the handler API read the sources file from here, and
    stay light."""
    if name == "PauseStore":
        from . import pauses

        return getattr(pauses, name)
    if name in ("Laned", "laned"):
        from . import lanes

        return getattr(lanes, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

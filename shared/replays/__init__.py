"""webhook_ingest.shared.replays: what each of its modules holds.

- model  Replays of archived events by selection (docs/reference.md §8, "Replaying archived events")
- store  Replays of archived events in Postgres (`shared/replays/model.py` says what they are)
- keys   The idempotency keys of a replay by selection (docs/design.md, "A replay by selection")
"""

from typing import TYPE_CHECKING, Any

__all__ = ["EventReplay", "EventReplayJob", "EventReplayStore", "keys"]

if TYPE_CHECKING:
    from .model import EventReplay
    from .store import EventReplayJob, EventReplayStore


def __getattr__(name: str) -> Any:
    """The replays themselves (their model and store, and the archive and Postgres below them) load
    on first use: the handler API imports `keys` from here, and stays light."""
    if name == "EventReplay":
        from . import model

        return getattr(model, name)
    if name in {"EventReplayJob", "EventReplayStore"}:
        from . import store

        return getattr(store, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

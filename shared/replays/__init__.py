"""webhook_ingest.shared.replays: what each of its modules holds.

- model  Replays of archived events by selection (docs/reference.md §8, "Replaying archived events")
- store  Replays of archived events in Postgres (`shared/replays/model.py` says what they are)
- keys   The idempotency keys of a replay by selection (docs/design.md, "A replay by selection")
"""

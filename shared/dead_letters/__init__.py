"""webhook_ingest.shared.dead_letters: what each of its modules holds.

- model  Dead letters (docs/reference.md §8): what workers give up on, for on-call.
- store  The dead-letter store
- bulk   Bulk actions on dead letters ("Replay all matching" / "Discard all matching").
"""

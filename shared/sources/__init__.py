"""webhook_ingest.shared.sources: what each of its modules holds.

- model         The sources file (docs/reference.md §3): one section per webhook provider endpoint.
- routes        A source's routes (docs/reference.md §3 `routes`; why: docs/design.md, "Routes")
- ignore_rules  A source's `ignore` rules (docs/reference.md §3)
- pauses        Paused sources (docs/reference.md §8.3)
- retention     A source's `retention` (docs/reference.md §3): how long the archive keeps its events.
"""

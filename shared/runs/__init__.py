"""webhook_ingest.shared.runs: what each of its modules holds.

- paced  Acting on a frozen set one item at a time
- locks  A paced run's locks: what orders a Cancel against the item in flight, and what lets a Cancel …
"""

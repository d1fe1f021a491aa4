"""webhook_ingest.shared.audit: what each of its modules holds.

- actor  Who acts (an `Actor`): a token's role through the console or the admin API, or the CLI's OS user.
- log    The audit log: every replay, discard, pause, resume and cancel, who did it, newest first.
"""

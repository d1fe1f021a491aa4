"""webhook_ingest.shared.audit: what each of its modules holds.

- actor  Who acts (an `Actor`): a token's role through the console or the admin API, or the CLI's OS user.
- log    The audit log: every replay, discard, pause, resume and cancel, who did it, newest first.
"""

from .actor import UNKNOWN_ACTOR, Actor
from .log import AuditLog, record_audit

__all__ = ["UNKNOWN_ACTOR", "Actor", "AuditLog", "record_audit"]

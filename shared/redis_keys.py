"""A key's name in Redis and its completion marker — written by the workers
(`workers/claim/idempotency.py`), read by the ingress's duplicate fast path
(`ingress/intake/done_markers.py`): one format, said here once.

`NS:key:<idempotency key>` holds the Redlock value while a worker holds the
key, then `done:<payload_sha256>` once it completed.
"""

DONE_PREFIX = "done:"


def key_prefix(namespace: str) -> str:
    return f"{namespace}:key:"


def done_marker(payload_sha256: str) -> str:
    return DONE_PREFIX + payload_sha256

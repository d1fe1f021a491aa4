"""The peers' realistic handler's call (the pause step of
tests/bench/peers/measure.py): a POST of the event to PEER_DOWNSTREAM_URL
with its key as `Idempotency-Key`, as our `forward` sends it, before the
row is written. Standard library only: it runs in the peers' venv."""

import os
import urllib.request

CALLING_SOURCE = "calls"  # the source whose events go to the calling handler


def call(key: str, body: str) -> None:
    request = urllib.request.Request(
        os.environ["PEER_DOWNSTREAM_URL"],
        data=body.encode(),
        headers={"Idempotency-Key": key, "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10):
        pass

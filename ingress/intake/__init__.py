"""webhook_ingest.ingress.intake: what each of its modules holds.

- webhooks          `POST /webhooks/{source}`: verify, identify, publish, then answer.
- ordered           Ordered sources' intake: an event of a source or route with `ordering` becomes a row of its …
- content_encoding  A webhook body's `Content-Encoding`, decoded here and not by aiohttp.
- content_bindings  Signed content bound to the ids it came with, one per type (docs/reference.md §5, "An identity …
- limits            What an endpoint facing the internet needs besides signatures
- failure_budget    A budget per client for requests that fail verification.
- slots             How many webhook requests one ingress process works on, and how many of them one client may hold …
- done_markers      The duplicate fast path (docs/reference.md §6, `200 {"status":"duplicate"}`).
- redis_get         GETs pipelined on one connection to one Redis, for the duplicate lookup that every webhook …
- refusals          Log lines about clients refused before anything was spent on them.
"""

from .content_bindings import ContentBindings, content_bindings_key
from .done_markers import DoneMarkers, done_markers_key
from .failure_budget import failure_budget_key
from .limits import handler_args, read_form_within, setup_limits, sign_in_throttle_key
from .ordered import ordered_intake_ctx
from .redis_get import connect_get
from .slots import slots_key

__all__ = [
    "ContentBindings",
    "DoneMarkers",
    "connect_get",
    "content_bindings_key",
    "done_markers_key",
    "failure_budget_key",
    "handler_args",
    "ordered_intake_ctx",
    "read_form_within",
    "setup_limits",
    "sign_in_throttle_key",
    "slots_key",
    "webhooks",
]

"""Every Prometheus metric the pipeline exports, in one place.

Both sides import this module; each process only moves the series it owns.
Names and labels are the contract of docs/reference.md §10 (alerts and dashboards in
`deploy/` refer to them).
"""

from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, Counter, Gauge, Histogram, generate_latest

if TYPE_CHECKING:
    from aiohttp import web

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)

ingress_requests = Counter(
    "webhook_ingress_requests_total",
    "Webhook requests answered by the ingress, by source and HTTP status.",
    ["source", "status"],
)
ingress_replays = Counter(
    "webhook_ingress_replays_total",
    "Verified requests answered 200 duplicate because their signed content came first with another id or"
    " type read from a header the signature does not cover (reference §5), by source.",
    ["source"],
)
ingress_ignored = Counter(
    "webhook_ingress_ignored_total",
    "Verified events answered 200 ignored and never queued, by source and the ignore rule that matched "
    "(field=value, as the sources file writes it).",
    ["source", "rule"],
)
ingress_request_duration = Histogram(
    "webhook_ingress_request_duration_seconds",
    "Time from request start to response, by source.",
    ["source"],
    buckets=LATENCY_BUCKETS,
)
events = Counter(
    "webhook_events_total",
    "Events handled by workers, by outcome (processed, stale, duplicate, conflict, retried, dead).",
    ["source", "outcome"],
)
processing_duration = Histogram(
    "webhook_processing_duration_seconds",
    "Time a worker spends on one event, from delivery to ack.",
    ["source"],
    buckets=LATENCY_BUCKETS,
)
idempotency_store_errors = Counter(
    "webhook_idempotency_store_errors_total",
    "Failed calls to an idempotency store (redis), by store.",
    ["store"],
)
postgres_sessions_refused = Counter(
    "webhook_postgres_sessions_refused_total",
    "Sessions Postgres refused for want of room (max_connections or a role's limit); each run waits and asks again.",
)
handlers_cancelled = Counter(
    "webhook_handlers_cancelled_total",
    "Handlers cancelled because their key's lease could not be renewed in time (the event runs again later).",
)
idempotency_degraded = Gauge(
    "webhook_idempotency_degraded",
    "1 while Redis is unreachable and workers rely on Postgres alone.",
)
ingress_rate_limit_local = Gauge(
    "webhook_ingress_rate_limit_local",
    "1 while Redis is unreachable and each ingress process counts rate limits on its own.",
)
forward_rate_limit_local = Gauge(
    "webhook_forward_rate_limit_local",
    "1 while Redis is unreachable and each worker process paces forward deliveries on its own (each at the whole "
    "rate).",
)
forward_rate_wait = Counter(
    "webhook_forward_rate_wait_seconds_total",
    "Seconds forward deliveries waited for their turn under their source's handler_options.rate_limit, by source.",
    ["source"],
)
dead_letters_open = Gauge(
    "webhook_dead_letters_open",
    "Dead letters with status 'dead' (waiting for on-call).",
)
incidents_unresolved = Gauge(
    "webhook_incidents_unresolved",
    "Incidents not yet resolved, by state (open, acknowledged).",
    ["state"],
)
broker_suspected = Counter(
    "webhook_ingress_broker_suspected_total",
    "Times the ingress stopped publishing (the broker silent for its patience, a failed publish, too many "
    "waiting) and sent requests to the outbox until a probe was confirmed.",
)
outbox_pending = Gauge(
    "webhook_outbox_pending",
    "Events stored in the outbox while the broker was away, not yet published.",
)
outbox_unreadable = Gauge(
    "webhook_outbox_unreadable",
    "Outbox rows this ingress process cannot decode: left in the table for an operator, the rows behind them "
    "published.",
)
outbox_oldest_age = Gauge(
    "webhook_outbox_oldest_age_seconds",
    "Age of the oldest event in the outbox (0 when it is empty).",
)
ordering_unkeyed = Counter(
    "webhook_ordering_unkeyed_total",
    "Events of an ordered source (a route's run, for a routed one) whose ordering key resolved to nothing: "
    "accepted and run unordered, as a source without ordering, by source.",
    ["source"],
)
ordering_wake_ups_failed = Counter(
    "webhook_ordering_wake_ups_failed_total",
    "Wake-ups of an ordering lane the ingress could not publish (its events are stored; a worker's watchdog "
    "finds the lane within a second).",
)
dead_letter_record_failures = Counter(
    "webhook_dead_letter_record_failures_total",
    "Failed attempts to record a poison message as a dead letter (it waits unacked in NS.dead meanwhile).",
)
archive_rows_dropped = Counter(
    "webhook_archive_rows_dropped_total",
    "Event archive rows (an arrival, or what became of one) this process did not write: its buffer was full while "
    "Postgres was away (buffer_full), Postgres refused the row (refused: a day without its table), or the process "
    "stopped first (stopping).",
    ["reason"],
)
archive_rows_waiting = Gauge(
    "webhook_archive_rows_waiting",
    "Event archive rows this process holds, not yet written to Postgres.",
)
archive_bytes = Gauge(
    "webhook_archive_bytes",
    "Bytes on disk of each source's event archive: its days' tables, their indexes and TOAST.",
    ["source"],
)

workers_silent = Gauge(
    "webhook_workers_silent",
    "Workers whose heartbeat is older than three of their intervals and that did not stop cleanly (paused, hung, cut "
    "off from Postgres, or dead without a word); read by the ingress from the workers' heartbeat rows.",
)
workers_degraded = Gauge(
    "webhook_workers_degraded",
    "Live workers whose last heartbeat says Redis quorum is lost (they run on Postgres alone); read by the ingress.",
)


async def endpoint(request: "web.Request") -> "web.Response":
    """GET /metrics, in the ingress and on a worker's --metrics-port: this process's series."""
    from aiohttp import web  # here: a worker without --metrics-port starts without aiohttp's server

    return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})


ordering_blocked_keys = Gauge(
    "webhook_ordering_blocked_keys",
    "Ordering keys (lanes) a dead letter blocks, by source: their later events wait for on-call's replay or discard.",
    ["source"],
)
ordering_blocked_oldest = Gauge(
    "webhook_ordering_blocked_oldest_seconds",
    "Age of the oldest block of an ordering key, by source (0 when none is blocked).",
    ["source"],
)
ordering_waiting_events = Gauge(
    "webhook_ordering_waiting_events",
    "Events of ordered sources accepted and waiting in their lanes (behind a block too; a dead one not), by source.",
    ["source"],
)
ordering_unknown_lanes = Gauge(
    "webhook_ordering_unknown_lanes",
    "Ordering keys (lanes) with events waiting whose source or route the sources file lacks, by source: "
    "no worker takes them.",
    ["source"],
)
ordering_waiting_oldest = Gauge(
    "webhook_ordering_waiting_oldest_seconds",
    "Age of the oldest event waiting in an ordering lane, by source (0 when none waits).",
    ["source"],
)

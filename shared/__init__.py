"""Code both the ingress and the workers use. A leaf: never imports them.

Its packages and flat modules, in layers, lowest first: each imports only
from its own layer and those below, and no two import each other
(tests/unit/test_seams.py holds the same order and checks every import,
also those inside functions).

0. errors, service_errors, storable_text, storable_json, backoff, redis_keys — plain values, errors, waits
1. event, settings — what an event is, the process's settings: words the rest speaks
2. observability, db, broker, signatures — the services' clients (logs, metrics, traces; Postgres;
   RabbitMQ) and the signature checks
3. audit, runs, ratelimit, incidents, worker_heartbeats, ordering — small stores over those: who acted, paced
   runs and their locks, rate limits, incidents, heartbeats, ordering keys' rows
4. sources — the sources file: its settings (retention, routes, ignore rules) and its pauses, audited
5. archive — the event archive: reads a source's routes, knows nothing of who replays or discards
6. dead_letters, replays — act on archived events: a dead letter's discard or replay writes its archived
   row; a replay is a frozen selection of the archive
7. upkeep — the task every process runs over the archive and the replays: days, settling, pruning
"""

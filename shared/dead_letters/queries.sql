-- Named SQL of shared/dead_letters/ (loaded by shared.db.queries.load_queries).

-- dead letters ---------------------------------------------------------------
-- Written by workers (shared.dead_letters.model.record_dead_letter), read and
-- acted on through shared.dead_letters.store by `webhook-ingest dlq …`, the
-- admin HTTP API and the console.

-- name: insert_dead_letter
-- One open dead letter per event (key + payload; a unique partial index):
-- when one is open already (a worker died between recording it and acking
-- the message, and the redelivery failed again), that one's id, nothing
-- inserted. A replay marks the row `replayed` in the transaction that
-- publishes it, so a replayed event that fails again before that commit
-- waits here for it, then gets a new row. An event completed meanwhile
-- (another copy's chain) gets none: no row is returned. The completion
-- must be this event's: its event id too, since event evt_a's route billing
-- and event evt_a#billing share the key SOURCE:evt_a#billing (docs/design.md,
-- "Routes"), and the route's completion is not the plain event's.
WITH done AS (
    SELECT FROM processed_events WHERE key = $1::text AND payload_sha256 = $4::text AND event_id = $3::text
), inserted AS (
    INSERT INTO dead_letters (key, source, event_id, payload_sha256, body, payload, headers,
                              received_at, attempts, errors, route, arrival)
    SELECT $1::text, $2::text, $3::text, $4::text, $5::bytea, $6::jsonb, $7::jsonb,
           $8::timestamptz, $9::integer, $10::jsonb, $11::text, $12::int8
    WHERE NOT EXISTS (SELECT FROM done)
    ON CONFLICT (key, payload_sha256) WHERE status = 'dead' DO NOTHING
    RETURNING id
)
SELECT id FROM inserted
UNION ALL
SELECT id FROM dead_letters
WHERE key = $1::text AND payload_sha256 = $4::text AND status = 'dead' AND NOT EXISTS (SELECT FROM inserted)

-- name: list_dead_letters
-- Newest first; $1 source (NULL: every source), $2 status (NULL: every
-- status), $3 limit (NULL: no limit). The body and the error history stay
-- in the table: a listing needs only the last error.
SELECT id, key, source, event_id, route, status, attempts, created_at, updated_at,
       errors -> -1 AS last_error
FROM dead_letters
WHERE ($1::text IS NULL OR source = $1)
  AND ($2::text IS NULL OR status = $2)
ORDER BY id DESC
LIMIT $3

-- name: get_dead_letter
SELECT *, errors -> -1 AS last_error
FROM dead_letters
WHERE id = $1

-- name: dead_letters_to_replay
-- The rows a replay publishes: the given ids (whatever their status: an
-- explicit id is the operator's decision), or with $2 every open one,
-- optionally of one source ($3). Oldest first, the order they failed in.
-- `version` is what claim_for_replay checks: the row as this replay read it;
-- the last attempt's trace, what the replay's own trace links to.
SELECT id, key, source, event_id, route, payload_sha256, body, headers, received_at, arrival,
       errors -> -1 ->> 'type' AS last_error_type, xmin AS version,
       errors -> -1 ->> 'trace_id' AS last_trace_id, errors -> -1 ->> 'span_id' AS last_span_id
FROM dead_letters
WHERE (id = ANY($1::bigint[]) OR ($2 AND status = 'dead' AND ($3::text IS NULL OR source = $3)))
ORDER BY id

-- name: claim_for_replay
-- A replay takes its row only as it read it: $2 is the row's xmin then (the
-- transaction that wrote that version; any change of the row gives it
-- another). Of two replays of one row at once, the second waits here for
-- the first's commit, then finds a newer version and claims nothing: it
-- skips the row instead of publishing it a second time.
UPDATE dead_letters SET status = 'replayed', updated_at = now()
WHERE id = $1 AND xmin = $2
RETURNING id

-- name: set_dead_letter_status
UPDATE dead_letters SET status = $2, updated_at = now()
WHERE id = ANY($1::bigint[])
RETURNING id

-- name: count_open_dead_letters
SELECT count(*) FROM dead_letters WHERE status = 'dead'

-- name: search_dead_letters
-- The console's filtered list, newest first, one page (or, with status
-- 'dead' and no limit, the set a bulk action freezes): $1 source, $2
-- status, $3 last error type, $4 created at or after, $5 created before, $6
-- free text in the key or the last error's message (case-insensitive, no
-- wildcards), $7 only ids below this one (the next page), $8 page size.
-- NULL: no filter.
SELECT id, key, source, event_id, route, status, attempts, created_at, updated_at,
       errors -> -1 AS last_error
FROM dead_letters
WHERE ($1::text IS NULL OR source = $1)
  AND ($2::text IS NULL OR status = $2)
  AND ($3::text IS NULL OR errors -> -1 ->> 'type' = $3)
  AND ($4::timestamptz IS NULL OR created_at >= $4)
  AND ($5::timestamptz IS NULL OR created_at < $5)
  AND ($6::text IS NULL OR strpos(lower(key), lower($6)) > 0
       OR strpos(lower(coalesce(errors -> -1 ->> 'message', '')), lower($6)) > 0)
  AND ($7::bigint IS NULL OR id < $7)
ORDER BY id DESC
LIMIT $8

-- name: dead_letter_choices
-- What the filter form offers: every source and last error type seen.
SELECT array(SELECT DISTINCT source FROM dead_letters ORDER BY 1) AS sources,
       array(SELECT DISTINCT errors -> -1 ->> 'type' FROM dead_letters
             WHERE errors -> -1 ->> 'type' IS NOT NULL ORDER BY 1) AS error_types

-- name: lock_dead_letter
-- A replay or discard from the console: the row, locked until the action
-- commits, so a second click (or another on-call person) waits, then sees
-- the new status instead of acting twice.
SELECT id, key, source, event_id, route, payload_sha256, body, headers, received_at, arrival, status,
       errors -> -1 ->> 'type' AS last_error_type, xmin AS version,
       errors -> -1 ->> 'trace_id' AS last_trace_id, errors -> -1 ->> 'span_id' AS last_span_id
FROM dead_letters
WHERE id = $1
FOR UPDATE

-- name: insert_replay
-- One more entry in the dead letter's replay history; its id names the
-- replay's retry chain (workers/claim/attempts.py).
INSERT INTO dead_letter_replays (dead_letter_id, actor, bulk_action_id)
VALUES ($1, $2, $3)
RETURNING id

-- name: forget_handed_on
-- A discarded dead letter's event starts afresh if the provider sends it
-- again: its key forgets the attempt handed on (workers/claim/attempts.py), when
-- that record is of the discarded payload. Fence rows locked in key order,
-- as the workers' statements lock them (workers/queries.sql, extend_leases).
WITH doomed AS (
    SELECT key_fences.key FROM key_fences JOIN dead_letters
        ON key_fences.key = dead_letters.key AND key_fences.payload_sha256 = dead_letters.payload_sha256
    WHERE dead_letters.id = ANY($1::bigint[])
    ORDER BY key_fences.key FOR UPDATE OF key_fences
)
UPDATE key_fences SET replay_of = 0, attempt = 0, payload_sha256 = NULL, arrival = NULL
FROM doomed WHERE key_fences.key = doomed.key

-- name: replays_of
SELECT replayed_at, actor, bulk_action_id
FROM dead_letter_replays
WHERE dead_letter_id = $1
ORDER BY id

-- name: insert_bulk_action
INSERT INTO console_bulk_actions (action, dead_letter_ids, filter, created_by)
VALUES ($1, $2::bigint[], $3::jsonb, $4)
RETURNING id

-- name: get_bulk_action
-- The action, and the dead letter a Cancel counted done that its runner,
-- dead mid-act, never stepped (cancel_bulk_action): none or one.
SELECT b.*, CASE WHEN f.in_doubt THEN ARRAY[f.item] ELSE '{}'::bigint[] END AS in_doubt
FROM console_bulk_actions b
LEFT JOIN paced_run_in_flight f ON f.kind = 'bulk_action' AND f.run_id = b.id
WHERE b.id = $1

-- name: claim_bulk_action
-- Start (or resume after a failure) at $2 per second: only one process runs it.
UPDATE console_bulk_actions
SET state = 'running', rate = $2, error = NULL, started_at = coalesce(started_at, now())
WHERE id = $1 AND state IN ('prepared', 'failed')
RETURNING *

-- name: bulk_action_step
-- One dead letter handled: $2 the id, $3 true when it was acted on, false
-- when it was skipped (changed meanwhile, or not replayable).
UPDATE console_bulk_actions
SET done = CASE WHEN $3 THEN done || $2::bigint ELSE done END,
    skipped = CASE WHEN $3 THEN skipped ELSE skipped || $2::bigint END
WHERE id = $1

-- name: finish_bulk_action
UPDATE console_bulk_actions
SET state = $2, error = $3, finished_at = now()
WHERE id = $1 AND state = 'running'

-- name: cancel_bulk_action
-- Under the run's lock, as cancel_event_replay: a dead letter marked in
-- flight and neither done nor skipped (its runner died mid-act). Of a
-- replay it is counted done, and in doubt: its publish may have gone out.
-- Of a discard it is known: the act commits with its step (a savepoint of
-- the held session), so with no step it never happened, unless a runner
-- of the previous release committed it apart (an upgrade): counted done
-- when the dead letter is discarded and no one else's discard names it,
-- else not, and never in doubt. Every other discard says whose it was in
-- its own transaction: a single one (its page, `dlq discard`, the admin
-- API, an incident's) by its `discard` audit entry, another bulk
-- discard's by its step (`done`).
WITH run AS (
    SELECT b.id, b.action, f.item AS in_flight FROM console_bulk_actions b
    LEFT JOIN paced_run_in_flight f ON f.kind = 'bulk_action' AND f.run_id = b.id
                                   AND NOT f.item = ANY(b.done || b.skipped)
    WHERE b.id = $1 AND b.state IN ('prepared', 'running', 'failed')
), judged AS (
    SELECT run.id, run.in_flight, run.action = 'replay' AS in_doubt,
           run.action = 'replay' OR (
               EXISTS (SELECT FROM dead_letters d WHERE d.id = run.in_flight AND d.status = 'discarded')
               AND NOT EXISTS (SELECT FROM audit_log l WHERE l.dead_letter_ids @> ARRAY[run.in_flight]
                                                         AND l.action = 'discard')
               AND NOT EXISTS (SELECT FROM console_bulk_actions o WHERE o.id <> run.id AND o.action = 'discard'
                                                                    AND run.in_flight = ANY(o.done))) AS counted
    FROM run WHERE run.in_flight IS NOT NULL
), doubted AS (
    UPDATE paced_run_in_flight f SET in_doubt = true FROM judged
    WHERE f.kind = 'bulk_action' AND f.run_id = judged.id AND judged.in_doubt
)
UPDATE console_bulk_actions b SET state = 'cancelled', finished_at = now(),
    done = CASE WHEN judged.counted THEN b.done || judged.in_flight ELSE b.done END
FROM run LEFT JOIN judged ON judged.id = run.id
WHERE b.id = run.id
RETURNING b.id

-- name: bulk_action_act_settled
-- Before cancel_bulk_action, under the run's lock: the dead letter bulk
-- action $1 has in flight, once no transaction acting on it is open
-- (waiting, within the Cancel's lock_timeout). A runner of the previous
-- release discards over a pooled connection of its own, which outlives its
-- held session: frozen mid-act past HOLD_SECONDS, its session ended and
-- let the run go, its discard still to commit. Read before it lands, the
-- Cancel counted it not done; another operator's Discard in progress, read
-- before its audit entry commits, would be counted this action's.
SELECT FROM dead_letters d
WHERE d.id = (SELECT f.item FROM paced_run_in_flight f WHERE f.kind = 'bulk_action' AND f.run_id = $1)
FOR SHARE OF d

-- name: bulk_action_acted_apart
-- Whether dead letter $2, in flight when a runner of bulk action $1 died
-- and no longer open now, was acted on by that runner ($3 the action): a
-- runner of the previous release (an upgrade) commits its act apart from
-- its step. A replay by it names the action in the replay history; a
-- discard, as cancel_bulk_action judges it: discarded, and no other
-- discard names it (a 'discard' audit entry, another bulk discard's step).
-- Otherwise someone else changed it meanwhile: skipped, not counted done.
SELECT CASE WHEN $3 = 'replay'
            THEN EXISTS (SELECT FROM dead_letter_replays r WHERE r.dead_letter_id = $2 AND r.bulk_action_id = $1)
            ELSE EXISTS (SELECT FROM dead_letters d WHERE d.id = $2 AND d.status = 'discarded')
                 AND NOT EXISTS (SELECT FROM audit_log l WHERE l.dead_letter_ids @> ARRAY[$2::bigint]
                                                           AND l.action = 'discard')
                 AND NOT EXISTS (SELECT FROM console_bulk_actions o WHERE o.id <> $1 AND o.action = 'discard'
                                                                      AND $2 = ANY(o.done)) END

-- name: bulk_action_in_flight
-- Dead letter $2 about to be acted on by bulk action $1, committed before
-- (cancel_bulk_action reads it when the runner never stepped it).
INSERT INTO paced_run_in_flight (kind, run_id, item) VALUES ('bulk_action', $1, $2)
ON CONFLICT (kind, run_id) DO UPDATE SET item = EXCLUDED.item, marked_at = now(), in_doubt = false

-- name: lock_bulk_action
-- The runner's hold of its bulk action for one dead letter (lock_event_replay's).
-- `orphaned`: the dead letter a runner marked in flight and never stepped.
SELECT b.state, f.item AS orphaned FROM console_bulk_actions b
LEFT JOIN paced_run_in_flight f ON f.kind = 'bulk_action' AND f.run_id = b.id AND NOT f.item = ANY(b.done || b.skipped)
WHERE b.id = $1 FOR UPDATE OF b

-- name: outcomes_last_hour
-- The console's overview, from what Postgres knows (retries and duplicates
-- are counted only in the workers' metrics).
SELECT (SELECT count(*) FROM processed_events WHERE completed_at > now() - interval '1 hour') AS processed,
       (SELECT count(*) FROM dead_letters WHERE created_at > now() - interval '1 hour') AS dead,
       (SELECT count(*) FROM dead_letter_replays WHERE replayed_at > now() - interval '1 hour') AS replayed,
       (SELECT count(*) FROM event_conflicts WHERE seen_at > now() - interval '1 hour') AS conflict

-- name: outbox_exists
SELECT to_regclass('outbox') IS NOT NULL

-- name: count_outbox
SELECT count(*) FROM outbox

-- name: waiting_in_a_lane
-- Whether the event of dead letter row ($1 source, $2 key) waits in an
-- ordering lane already (docs/design.md, "Ordering keys"): replayed in
-- place by an earlier replay, not run yet. Another replay of it is
-- skipped: published, it could run before the rows its lane holds first.
SELECT EXISTS (SELECT FROM ordered_events WHERE source = $1 AND key = $2 AND state = 'pending')

-- name: ordering_block
-- The ordering lane dead letter $1 blocks (docs/design.md, "Ordering
-- keys"; blocked_by is unique), and how many events wait behind it; none
-- when it blocks nothing.
SELECT lane, pending AS waiting, blocked_since FROM ordering_keys WHERE blocked_by = $1

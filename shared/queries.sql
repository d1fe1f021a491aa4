-- Named SQL blocks of the `shared` package (loaded by shared.db.queries.load_queries).

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

-- name: insert_audit
INSERT INTO audit_log (role, name, via, action, dead_letter_ids, detail)
VALUES ($1, $2, $3, $4, $5::bigint[], $6::jsonb)
RETURNING id

-- name: list_audit
-- Newest first; $1 only entries naming this dead letter (NULL: all), $2
-- only ids below this one (the next page), $3 page size.
SELECT id, at, role, name, via, action, dead_letter_ids, detail
FROM audit_log
WHERE ($1::bigint IS NULL OR dead_letter_ids @> ARRAY[$1::bigint])
  AND ($2::bigint IS NULL OR id < $2)
ORDER BY id DESC
LIMIT $3

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

-- the event archive --------------------------------------------------------
-- Written in batches behind the requests' and the workers' backs
-- (shared/archive/writer.py) through shared.archive.store; its tables are
-- made and dropped by event_archive_keep (migration 0008). Each side names
-- a row by (source, key, received_at, arrival), the receive time in integer
-- milliseconds and the arrival's id as the message carries them (0017).

-- name: archive_arrivals
-- What the ingress accepted (status queued), answered as a duplicate, or
-- ignored (with the rule that matched). A row a worker wrote first (its
-- outcome, no body yet) gets the body, headers and type; any other row is
-- left as it is.
INSERT INTO event_archive AS archived (source, key, received_at, arrival, event_id, event_type, payload_sha256, body,
                                       headers, status, ignore_rule)
SELECT source, key, timestamptz 'epoch' + received_ms * interval '1 millisecond', arrival, event_id, event_type,
       payload_sha256, body, headers::jsonb, status, ignore_rule
FROM unnest($1::text[], $2::text[], $3::int8[], $4::int8[], $5::text[], $6::text[], $7::text[], $8::bytea[],
            $9::text[], $10::text[], $11::text[])
     AS arriving(source, key, received_ms, arrival, event_id, event_type, payload_sha256, body, headers, status,
                 ignore_rule)
ON CONFLICT (source, key, received_at, arrival) DO UPDATE
SET body = EXCLUDED.body, headers = EXCLUDED.headers, event_type = EXCLUDED.event_type
WHERE archived.body IS NULL

-- name: archive_outcomes
-- What became of arrivals, from the workers: written over the row's status
-- only when it is a step on (event_archive_step: a later chain, a later
-- attempt, or a further step of the same one), and `duplicate` only over a
-- row still queued (a copy of a retry message is not its event's end), or
-- over a `retrying` row of an earlier attempt: the retry message itself found
-- the event completed (after a prune, maybe only Redis still knew), which
-- ends the chain, and no completion may be left for the sweep.
-- At one chain and attempt the arrival's own end steps over a `duplicate`
-- or a `conflict` written first by a twin message of the arrival (an
-- outbox row beside a publish confirmed late, a second fan-out; a
-- conflict: the twin still found another payload's completion, which a
-- prune then forgot): `dead`, and `processed` when
-- its run's completion ($12: the route, its key KEY#ROUTE) names this
-- arrival and is younger than the sweep's grace ($13 seconds). So never
-- over a `duplicate` a sweep wrote guessing which copy ran: this release's
-- guesses only for a completion that names none, the previous release's
-- (still sweeping during an upgrade) only past the grace. One run, one
-- `processed`. And a twin's `duplicate` of the arrival its run's
-- completion names, or the key's last attempt handed on names (key_fences,
-- migration 0023: the twin found that attempt run), is not written at all:
-- that arrival's end is its own chain's, its worker's note or, the batch
-- lost with a killed worker, the sweep's (which reads the row still queued
-- or retrying, never a `duplicate` one).
-- A row the ingress has not written yet is made without its body.
WITH outcome AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::int8[], $4::int8[], $5::text[], $6::text[], $7::text[],
                         $8::int8[], $9::int4[], $10::text[], $11::int8[], $12::text[])
        AS outcome(source, key, received_ms, arrival, event_id, payload_sha256, status, replay_of, attempts,
                   last_error, at_ms, route)
)
INSERT INTO event_archive AS archived (source, key, received_at, arrival, event_id, payload_sha256, status, replay_of,
                                       attempts, last_error, completed_at)
SELECT source, key, timestamptz 'epoch' + received_ms * interval '1 millisecond', arrival, event_id, payload_sha256,
       status, replay_of, attempts, last_error,
       CASE WHEN status = 'processed' THEN timestamptz 'epoch' + at_ms * interval '1 millisecond' END
FROM outcome
WHERE NOT (status = 'duplicate' AND (EXISTS (  -- a twin's, of the arrival that ran (see above)
    SELECT FROM processed_events p WHERE p.key = outcome.key || coalesce('#' || outcome.route, '')
                                     AND p.event_id = outcome.event_id AND p.arrival = outcome.arrival)
  OR EXISTS (  -- a twin's, of the arrival whose attempt was handed on
    SELECT FROM key_fences f WHERE f.key = outcome.key || coalesce('#' || outcome.route, '')
                               AND f.arrival = outcome.arrival AND f.payload_sha256 = outcome.payload_sha256)))
ON CONFLICT (source, key, received_at, arrival) DO UPDATE
SET status = EXCLUDED.status, replay_of = EXCLUDED.replay_of, attempts = EXCLUDED.attempts,
    last_error = coalesce(EXCLUDED.last_error, archived.last_error), completed_at = EXCLUDED.completed_at
WHERE (EXCLUDED.status <> 'duplicate' OR archived.status = 'queued'
       OR (archived.status = 'retrying'
           AND (EXCLUDED.replay_of, EXCLUDED.attempts) > (archived.replay_of, archived.attempts)))
  AND ((EXCLUDED.replay_of, EXCLUDED.attempts, event_archive_step(EXCLUDED.status))
       > (archived.replay_of, archived.attempts, event_archive_step(archived.status))
       OR (archived.status IN ('duplicate', 'conflict')
           AND (EXCLUDED.replay_of, EXCLUDED.attempts) = (archived.replay_of, archived.attempts)
           AND (EXCLUDED.status = 'dead' OR (EXCLUDED.status = 'processed' AND EXISTS (
               SELECT FROM outcome JOIN processed_events p ON p.key = outcome.key || coalesce('#' || outcome.route, '')
               WHERE outcome.source = archived.source AND outcome.key = archived.key
                 AND outcome.arrival = archived.arrival AND outcome.status = 'processed'
                 AND p.event_id = archived.event_id AND p.arrival = archived.arrival
                 AND p.completed_at > now() - make_interval(secs => $13))))))

-- name: archive_discarded
-- The arrivals whose dead letters ($1) on-call discarded, in the discard's
-- transaction: the one each names, and every other arrival of its event and
-- payload archived `dead` — a copy that ran and died while the dead letter
-- was open, which stands for it too (one open dead letter per event) —
-- unless a dead letter of the event not being discarded is still open (a
-- route's, or a newer one when this one was closed already): the copy is
-- that one's. A route's dead letter (key KEY#ROUTE) is of the arrival kept
-- under the event's own key KEY (docs/design.md, "Routes").
WITH acted AS (
    SELECT d.id, d.source, d.event_id, d.payload_sha256, d.received_at, d.arrival,
           CASE WHEN d.route IS NULL THEN d.key ELSE left(d.key, -(length(d.route) + 1)) END AS event_key
    FROM dead_letters d WHERE d.id = ANY($1::bigint[])
)
UPDATE event_archive SET status = 'discarded'
FROM acted
WHERE event_archive.source = acted.source AND event_archive.key = acted.event_key
  AND ((event_archive.received_at = acted.received_at AND event_archive.arrival = acted.arrival)
       OR (event_archive.status = 'dead' AND event_archive.event_id = acted.event_id
           AND event_archive.payload_sha256 = acted.payload_sha256
           AND NOT EXISTS (
               SELECT FROM (SELECT * FROM dead_letters WHERE key = acted.event_key
                            UNION ALL
                            SELECT * FROM dead_letters
                            WHERE route IS NOT NULL AND left(key, -(length(route) + 1)) = acted.event_key) other
               WHERE other.status = 'dead' AND other.id <> ALL($1::bigint[])
                 AND other.event_id = acted.event_id AND other.payload_sha256 = acted.payload_sha256)))

-- name: archive_replayed
-- The arrival of dead letter $1, replayed as chain $2 (dead_letter_replays.id)
-- in the replay's transaction: `queued` again in that chain at attempt 0,
-- which its outcomes step on from (and the sweep, reading only queued and
-- retrying rows, settles it should they be lost). So is every other arrival
-- of its event and payload archived `dead`, its attempts kept: a copy that
-- ran and died while the dead letter was open, which stands for it too (one
-- open dead letter per event) — unless another dead letter of the event is
-- still open (a route's, or a newer one when this one was closed already):
-- the copy is that one's. The replay runs the arrival named, and the sweep
-- settles the others from its end, copies of its run (`duplicate`) or
-- `dead` again. A route's dead letter is of the arrival kept under the
-- event's own key, as for a discard.
WITH acted AS (
    SELECT d.id, d.source, d.event_id, d.payload_sha256, d.received_at, d.arrival,
           CASE WHEN d.route IS NULL THEN d.key ELSE left(d.key, -(length(d.route) + 1)) END AS event_key
    FROM dead_letters d WHERE d.id = $1
)
UPDATE event_archive
SET status = 'queued', replay_of = $2,
    attempts = CASE WHEN event_archive.received_at = acted.received_at AND event_archive.arrival = acted.arrival
                    THEN 0 ELSE event_archive.attempts END
FROM acted
WHERE event_archive.source = acted.source AND event_archive.key = acted.event_key
  AND ((event_archive.received_at = acted.received_at AND event_archive.arrival = acted.arrival)
       OR (event_archive.status = 'dead' AND event_archive.event_id = acted.event_id
           AND event_archive.payload_sha256 = acted.payload_sha256
           AND NOT EXISTS (
               SELECT FROM (SELECT * FROM dead_letters WHERE key = acted.event_key
                            UNION ALL
                            SELECT * FROM dead_letters
                            WHERE route IS NOT NULL AND left(key, -(length(route) + 1)) = acted.event_key) other
               WHERE other.status = 'dead' AND other.id <> acted.id
                 AND other.event_id = acted.event_id AND other.payload_sha256 = acted.payload_sha256)))
  AND event_archive.replay_of < $2

-- name: archive_unsettled
-- The settling sweep's page (shared/archive/settling.py): rows still
-- queued or retrying, received more than $1 seconds ago and after the row
-- named ($2 received_at, $6 source, $7 key, $8 arrival: the last page's
-- last; NULL: from the oldest), in that order, at most $3 (read from the
-- partial index of unsettled rows on that whole name, migration 0022, the
-- page first: a backlog is never read whole, and rows sharing the last
-- one's millisecond are not skipped); each
-- with what Postgres recorded of its event more than $1 seconds ago, under
-- its key or one of its routes' (`KEY#ROUTE`; $4 sources, $5 their routes)
-- and with its event id (event evt_a's route billing and event
-- evt_a#billing share a key: docs/design.md, "Routes"): a completion, the
-- dead letter of its payload (open first), and whether an arrival of its
-- key is archived processed already. The completion read is one that
-- names this arrival if any (a route's), else one naming none (from
-- before 0020: the sweep guesses), else another arrival's.
SELECT a.source, a.key, a.received_at, a.arrival, a.status, a.attempts, a.replay_of, a.payload_sha256,
       done.payload_sha256 AS completed_sha256, done.attempts AS completed_attempts, done.completed_at,
       done.arrival AS completed_arrival,
       dead.status AS dead_letter, dead.attempts AS dead_attempts, dead.own AS own_dead_letter,
       EXISTS (SELECT FROM event_archive p WHERE p.source = a.source AND p.key = a.key AND p.status = 'processed')
           AS processed_already
FROM (SELECT source, key, received_at, arrival, event_id, status, attempts, replay_of, payload_sha256 FROM event_archive
      WHERE status IN ('queued', 'retrying') AND received_at < now() - make_interval(secs => $1)
        AND (received_at, source, key, arrival) > (coalesce($2::timestamptz, '-infinity'), coalesce($6::text, ''),
                                                   coalesce($7::text, ''), coalesce($8::int8, -9223372036854775808))
      ORDER BY received_at, source, key, arrival
      LIMIT $3) a
CROSS JOIN LATERAL (
    SELECT a.key || coalesce((SELECT array_agg(a.key || '#' || r.route) FROM unnest($4::text[], $5::text[])
                                  AS r(source, route) WHERE r.source = a.source), '{}') AS keys) named
LEFT JOIN LATERAL (
    SELECT p.payload_sha256, p.attempts, p.completed_at, p.arrival FROM processed_events p
    WHERE p.key = ANY(named.keys) AND p.event_id = a.event_id AND p.completed_at < now() - make_interval(secs => $1)
    ORDER BY p.arrival IS NOT DISTINCT FROM a.arrival DESC, p.arrival IS NULL DESC
    LIMIT 1) done ON true
LEFT JOIN LATERAL (
    SELECT d.status, d.attempts, d.received_at = a.received_at AND d.arrival = a.arrival AS own FROM dead_letters d
    WHERE d.key = ANY(named.keys) AND d.event_id = a.event_id AND d.payload_sha256 = a.payload_sha256
      AND d.status IN ('dead', 'discarded')
      AND d.updated_at < now() - make_interval(secs => $1)
    ORDER BY d.status = 'dead' DESC, d.id DESC LIMIT 1) dead ON true
ORDER BY a.received_at, a.source, a.key, a.arrival

-- name: archive_unsettled_of_pruned
-- archive_unsettled's columns for the rows still queued or retrying of the
-- events whose completions `prune` is deleting ($1-$7: the key, source,
-- event id, payload, attempts, completion time and arrival of each, as its
-- DELETE returned them), in its transaction: once the record is gone no
-- sweep can say what became of them. Each row with those completions as
-- the sweep reads processed_events (the one naming this arrival first, else
-- one naming none, else another's; no grace: this is the last look), the
-- dead letter of its payload (open first) and whether an arrival of its key
-- is archived processed already; each key's rows oldest first. An event's
-- rows are under its own key SOURCE:EVENT_ID (one join of the completions
-- with the archive: a lateral scan of them per row was 5,000 x 5,000
-- comparisons, 7.7 s a batch); its routes' completions under KEY#ROUTE, carrying its
-- event id (a replay's run, replay-R/KEY, is not its arrival's end); its
-- routes' dead letters are found by the event's key
-- (dead_letters_route_event_key), as on its page.
WITH pruned AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int4[], $6::timestamptz[], $7::int8[])
        AS pruned(key, source, event_id, payload_sha256, attempts, completed_at, arrival)
    WHERE pruned.key = pruned.source || ':' || pruned.event_id
       OR starts_with(pruned.key, pruned.source || ':' || pruned.event_id || '#')
)
SELECT DISTINCT ON (a.source, a.key, a.received_at, a.arrival)
       a.source, a.key, a.received_at, a.arrival, a.status, a.attempts, a.replay_of, a.payload_sha256,
       done.payload_sha256 AS completed_sha256, done.attempts AS completed_attempts, done.completed_at,
       done.arrival AS completed_arrival,
       dead.status AS dead_letter, dead.attempts AS dead_attempts, dead.own AS own_dead_letter,
       EXISTS (SELECT FROM event_archive p WHERE p.source = a.source AND p.key = a.key AND p.status = 'processed')
           AS processed_already
FROM pruned done
JOIN event_archive a ON a.source = done.source AND a.key = done.source || ':' || done.event_id
                    AND a.event_id = done.event_id AND a.status IN ('queued', 'retrying')
LEFT JOIN LATERAL (
    SELECT d.status, d.attempts, d.received_at = a.received_at AND d.arrival = a.arrival AS own
    FROM (SELECT * FROM dead_letters WHERE key = a.key
          UNION ALL
          SELECT * FROM dead_letters WHERE route IS NOT NULL AND left(key, -(length(route) + 1)) = a.key) d
    WHERE d.event_id = a.event_id AND d.payload_sha256 = a.payload_sha256 AND d.status IN ('dead', 'discarded')
    ORDER BY d.status = 'dead' DESC, d.id DESC LIMIT 1) dead ON true
-- each key's rows oldest first (shared/archive/settling.py's guess reads them so); each row once, with the
-- completion that names its arrival first, else one naming none, else another's
ORDER BY a.source, a.key, a.received_at, a.arrival, done.arrival IS NOT DISTINCT FROM a.arrival DESC,
         done.arrival IS NULL DESC

-- name: archive_settle_named
-- The arrivals the completions of a window name (processed_events.arrival)
-- still archived `duplicate` or `conflict`, made `processed`: the arrival's
-- own run is its end (docs/design.md, "The archive"). Such a row is a note
-- written of it before its run — by `prune`, settling it a copy of the
-- completion it deleted while its message was still on its way, or a twin
-- that still found another payload's completion — whose run's own note
-- was then lost with its worker; the sweep reads only queued and retrying
-- rows. The window: completions after ($1 completed_at, $2 key: the last
-- read; NULL: none yet), none older than $5 seconds before the grace,
-- completed more than $3 seconds ago (the grace: the run's own note may be
-- on its way), in that order, at most $4, read from
-- processed_events_completed_at; each arrival they name is a primary-key
-- probe of its source's days. Not a completion naming none (the sweep's
-- guess), nor a replay's run (replay-R/KEY is not its arrival's end); a
-- route's (KEY#ROUTE) names the arrival kept under KEY. Not over a row
-- whose payload has an open dead letter (the sweep's `dead` comes first),
-- nor when another arrival of the key is archived `processed` at this very
-- completion's time: a sweep's guess of which copy ran (the previous
-- release's, during an upgrade) — one run, one `processed`. Returns the
-- rows settled, the completions read and the last one read (where the next
-- page starts).
WITH page AS (
    SELECT p.key, p.source, p.event_id, p.payload_sha256, p.attempts, p.completed_at, p.arrival
    FROM processed_events p
    WHERE p.completed_at >= greatest(coalesce($1::timestamptz, '-infinity'),
                                     now() - make_interval(secs => $3::float8 + $5::float8))
      AND (p.completed_at, p.key) > (coalesce($1::timestamptz, '-infinity'), coalesce($2::text, ''))
      AND p.completed_at < now() - make_interval(secs => $3)
    ORDER BY p.completed_at, p.key
    LIMIT $4
), named AS (
    SELECT * FROM page
    WHERE page.arrival IS NOT NULL AND page.arrival <> 0
      AND (page.key = page.source || ':' || page.event_id
           OR starts_with(page.key, page.source || ':' || page.event_id || '#'))
), settled AS (
    UPDATE event_archive AS a
    SET status = 'processed', attempts = greatest(a.attempts, n.attempts), completed_at = n.completed_at
    FROM named n
    WHERE a.source = n.source AND a.key = n.source || ':' || n.event_id AND a.arrival = n.arrival
      AND a.event_id = n.event_id AND a.payload_sha256 = n.payload_sha256
      AND a.status IN ('duplicate', 'conflict')
      AND NOT EXISTS (
          SELECT FROM event_archive o
          WHERE o.source = a.source AND o.key = a.key AND o.status = 'processed'
            AND o.completed_at = n.completed_at AND o.arrival <> a.arrival)
      AND NOT EXISTS (
          SELECT FROM (SELECT * FROM dead_letters WHERE key = a.key
                       UNION ALL
                       SELECT * FROM dead_letters WHERE route IS NOT NULL AND left(key, -(length(route) + 1)) = a.key) d
          WHERE d.event_id = a.event_id AND d.payload_sha256 = a.payload_sha256 AND d.status = 'dead')
    RETURNING 1
)
SELECT (SELECT count(*) FROM settled) AS settled, (SELECT count(*) FROM page) AS read,
       last.completed_at, last.key
FROM (SELECT 1) one
LEFT JOIN (SELECT completed_at, key FROM page ORDER BY completed_at DESC, key DESC LIMIT 1) last ON true

-- name: archive_settle
-- The sweep's decisions: each row brought to its event's end, only while
-- it is still as the sweep read it (status $5, attempts $6, chain $10: a
-- dead letter replayed meanwhile leaves it queued at attempt 0 again, in
-- the replay's chain, which the end read of the chain before is not); a
-- live outcome written meanwhile wins, and the next round looks again.
-- $11, $12: the first and last receive time of the rows.
UPDATE event_archive AS a
SET status = s.status, attempts = s.attempts, completed_at = coalesce(s.completed_at, a.completed_at)
FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::int8[], $5::text[], $6::int4[], $7::text[], $8::int4[],
            $9::timestamptz[], $10::int8[])
     AS s(source, key, received_at, arrival, was, was_attempts, status, attempts, completed_at, was_replay_of)
WHERE a.source = s.source AND a.key = s.key AND a.received_at = s.received_at AND a.arrival = s.arrival
  AND a.status = s.was AND a.attempts = s.was_attempts AND a.replay_of = s.was_replay_of
  -- the page's range of the unsettled rows' index, not every partition whole
  AND a.status IN ('queued', 'retrying') AND a.received_at BETWEEN $11 AND $12

-- name: archive_keep
-- One source's tables (event_archive_keep); a lock it waits for longer than
-- the caller's lock_timeout fails it, to be tried again later.
SELECT made, dropped FROM event_archive_keep($1, $2, $3, $4, $5)

-- name: archive_sizes
-- Bytes on disk of each source's days ($1 sources, $2 their tables), indexes and TOAST included.
SELECT source, coalesce((SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree(to_regclass(source_table))
                         WHERE isleaf), 0)::int8 AS bytes
FROM unnest($1::text[], $2::text[]) AS archived(source, source_table)

-- searching the event archive (shared/archive/search.py: the filter, the
-- documents). A `queued` row whose key's lease is held is shown `processing`:
-- for a source with routes (the statement's last two arguments: the sources
-- file's sources and their route names, SourceRoutes), a lease on one of its
-- routes' keys, KEY#ROUTE, never on KEY (a routed event never runs under its
-- own key, and event `evt#b`'s key is event `evt`'s route `b`'s); for
-- the others, on KEY. `held` is read per queued row only (docs/design.md,
-- "Routes").

-- name: search_archive
-- One page, newest first: $1 source, $2 status (also 'processing'), $3
-- event type, $4 received at or after, $5 received before, $6 key prefix,
-- $7 event id prefix, $8 payload containment (jsonb), $9-$12 only rows
-- older than this (received_at, source, key, arrival): the next page; $13
-- its size; $14, $15 the sources file's routes (above).
-- NULL: no filter. A key prefix with a ':' also names its source (a key
-- is SOURCE:EVENT_ID, as archived_arrivals reads it): only that source's
-- tables are planned and read, and the rest of it is their event ids'
-- prefix, which their event id index serves (migration 0024).
-- 'processing' also says `a.status = 'queued'` (held.processing implies
-- it), which the unsettled index serves: held's own test was read off
-- every row. The event id prefix's index and the others: migration 0019.
SELECT a.source, a.key, a.received_at, a.arrival, a.event_id, a.event_type, a.payload_sha256, a.attempts,
       a.last_error, a.completed_at, a.replay_of, a.ignore_rule, CASE WHEN held.processing THEN 'processing' ELSE a.status END AS status
FROM event_archive a
CROSS JOIN LATERAL (SELECT a.status = 'queued' AND CASE WHEN a.source = ANY($14::text[])
    THEN EXISTS (SELECT FROM unnest($14::text[], $15::text[]) AS r(source, route)
                 WHERE r.source = a.source AND EXISTS (
                     SELECT FROM key_fences WHERE key_fences.key = a.key || '#' || r.route
                                              AND key_fences.lease_until > clock_timestamp()))
    ELSE EXISTS (SELECT FROM key_fences WHERE key_fences.key = a.key AND key_fences.lease_until > clock_timestamp())
    END AS processing) held
WHERE ($1::text IS NULL OR a.source = $1)
  AND ($2::text IS NULL OR CASE $2 WHEN 'processing' THEN a.status = 'queued' AND held.processing
                                  WHEN 'queued' THEN a.status = 'queued' AND NOT held.processing
                                  ELSE a.status = $2 END)
  AND ($3::text IS NULL OR a.event_type = $3)
  AND ($4::timestamptz IS NULL OR a.received_at >= $4)
  AND ($5::timestamptz IS NULL OR a.received_at < $5)
  AND ($6::text IS NULL OR starts_with(a.key, $6))
  AND ($6::text IS NULL OR strpos($6, ':') = 0 OR a.source = split_part($6, ':', 1))
  AND ($6::text IS NULL OR strpos($6, ':') = 0 OR starts_with(a.event_id, substr($6, strpos($6, ':') + 1)))
  AND ($7::text IS NULL OR starts_with(a.event_id, $7))
  AND ($8::jsonb IS NULL OR event_archive_payload(a.body) @> $8)
  AND ($9::timestamptz IS NULL OR (a.received_at, a.source, a.key, a.arrival) < ($9, $10::text, $11::text, $12::int8))
ORDER BY a.received_at DESC, a.source DESC, a.key DESC, a.arrival DESC
LIMIT $13

-- name: export_archive
-- search_archive's page ($1-$15) with what each row carried (body, headers):
-- `webhook-ingest events export` streams a selection page by page.
SELECT a.source, a.key, a.received_at, a.arrival, a.event_id, a.event_type, a.payload_sha256, a.body, a.headers,
       a.attempts, a.last_error, a.completed_at, a.replay_of, a.ignore_rule,
       CASE WHEN held.processing THEN 'processing' ELSE a.status END AS status
FROM event_archive a
CROSS JOIN LATERAL (SELECT a.status = 'queued' AND CASE WHEN a.source = ANY($14::text[])
    THEN EXISTS (SELECT FROM unnest($14::text[], $15::text[]) AS r(source, route)
                 WHERE r.source = a.source AND EXISTS (
                     SELECT FROM key_fences WHERE key_fences.key = a.key || '#' || r.route
                                              AND key_fences.lease_until > clock_timestamp()))
    ELSE EXISTS (SELECT FROM key_fences WHERE key_fences.key = a.key AND key_fences.lease_until > clock_timestamp())
    END AS processing) held
WHERE ($1::text IS NULL OR a.source = $1)
  AND ($2::text IS NULL OR CASE $2 WHEN 'processing' THEN a.status = 'queued' AND held.processing
                                  WHEN 'queued' THEN a.status = 'queued' AND NOT held.processing
                                  ELSE a.status = $2 END)
  AND ($3::text IS NULL OR a.event_type = $3)
  AND ($4::timestamptz IS NULL OR a.received_at >= $4)
  AND ($5::timestamptz IS NULL OR a.received_at < $5)
  AND ($6::text IS NULL OR starts_with(a.key, $6))
  AND ($6::text IS NULL OR strpos($6, ':') = 0 OR a.source = split_part($6, ':', 1))
  AND ($6::text IS NULL OR strpos($6, ':') = 0 OR starts_with(a.event_id, substr($6, strpos($6, ':') + 1)))
  AND ($7::text IS NULL OR starts_with(a.event_id, $7))
  AND ($8::jsonb IS NULL OR event_archive_payload(a.body) @> $8)
  AND ($9::timestamptz IS NULL OR (a.received_at, a.source, a.key, a.arrival) < ($9, $10::text, $11::text, $12::int8))
ORDER BY a.received_at DESC, a.source DESC, a.key DESC, a.arrival DESC
LIMIT $13

-- name: count_archive
-- How many rows search_archive's filter ($1-$8) matches, up to $9; $10, $11
-- the sources file's routes.
SELECT count(*) FROM (
    SELECT FROM event_archive a
    CROSS JOIN LATERAL (SELECT a.status = 'queued' AND CASE WHEN a.source = ANY($10::text[])
        THEN EXISTS (SELECT FROM unnest($10::text[], $11::text[]) AS r(source, route)
                     WHERE r.source = a.source AND EXISTS (
                         SELECT FROM key_fences WHERE key_fences.key = a.key || '#' || r.route
                                                  AND key_fences.lease_until > clock_timestamp()))
        ELSE EXISTS (SELECT FROM key_fences WHERE key_fences.key = a.key AND key_fences.lease_until > clock_timestamp())
        END AS processing) held
    WHERE ($1::text IS NULL OR a.source = $1)
      AND ($2::text IS NULL OR CASE $2 WHEN 'processing' THEN a.status = 'queued' AND held.processing
                                      WHEN 'queued' THEN a.status = 'queued' AND NOT held.processing
                                      ELSE a.status = $2 END)
      AND ($3::text IS NULL OR a.event_type = $3)
      AND ($4::timestamptz IS NULL OR a.received_at >= $4)
      AND ($5::timestamptz IS NULL OR a.received_at < $5)
      AND ($6::text IS NULL OR starts_with(a.key, $6))
      AND ($6::text IS NULL OR strpos($6, ':') = 0 OR a.source = split_part($6, ':', 1))
      AND ($6::text IS NULL OR strpos($6, ':') = 0 OR starts_with(a.event_id, substr($6, strpos($6, ':') + 1)))
      AND ($7::text IS NULL OR starts_with(a.event_id, $7))
      AND ($8::jsonb IS NULL OR event_archive_payload(a.body) @> $8)
    LIMIT $9
) capped

-- name: archived_arrivals
-- Every arrival of a key, oldest first: the event, its copies, its conflicts;
-- `processing` as the searches', $2 the route names of the key's source.
SELECT a.source, a.key, a.received_at, a.event_id, a.event_type, a.payload_sha256, a.body, a.headers, a.attempts,
       a.last_error, a.completed_at, a.replay_of, a.ignore_rule,
       CASE WHEN a.status = 'queued' AND CASE WHEN cardinality($2::text[]) > 0
           THEN EXISTS (SELECT FROM unnest($2::text[]) AS route WHERE EXISTS (
                            SELECT FROM key_fences WHERE key_fences.key = a.key || '#' || route
                                                     AND key_fences.lease_until > clock_timestamp()))
           ELSE EXISTS (SELECT FROM key_fences WHERE key_fences.key = a.key AND key_fences.lease_until > clock_timestamp())
           END
       THEN 'processing' ELSE a.status END AS status
FROM event_archive a
WHERE a.source = split_part($1, ':', 1) AND a.key = $1
ORDER BY a.received_at, a.arrival

-- name: archive_copies
-- How many copies (`duplicate`) and conflicts each key of a page ($2; $1
-- their sources) has in the archive: the console's Events columns.
SELECT a.key, count(*) FILTER (WHERE a.status = 'duplicate') AS copies,
       count(*) FILTER (WHERE a.status = 'conflict') AS conflicts
FROM event_archive a
WHERE a.source = ANY($1::text[]) AND a.key = ANY($2::text[])
GROUP BY a.key

-- name: archived_event_records
-- What the pipeline itself recorded of key $1, event id $2: its completion
-- (until `prune`), each of its routes' ($3, its source's route names, in
-- the file's order: [name, completion or null]), and its dead letters, its
-- routes' (KEY#ROUTE, with `route`) too. A completion is the event's only
-- with its event id: event `evt`'s route `b` completes under `evt#b`'s key,
-- carrying `evt` (docs/design.md, "Routes").
SELECT (SELECT to_jsonb(p) - 'fencing_token' FROM processed_events p WHERE p.key = $1 AND p.event_id = $2)
           AS completion,
       coalesce((SELECT jsonb_agg(jsonb_build_array(r.route, (SELECT to_jsonb(p) - 'fencing_token'
                                                               FROM processed_events p
                                                               WHERE p.key = $1 || '#' || r.route
                                                                 AND p.event_id = $2))
                                  ORDER BY r.place)
                 FROM unnest($3::text[]) WITH ORDINALITY AS r(route, place)),
                '[]') AS route_completions,
       coalesce((SELECT jsonb_agg(jsonb_build_object('id', d.id, 'status', d.status, 'attempts', d.attempts,
                                                     'received_at', d.received_at, 'created_at', d.created_at)
                                  || CASE WHEN d.route IS NULL THEN '{}'::jsonb
                                          ELSE jsonb_build_object('route', d.route) END
                                  ORDER BY d.id)
                 FROM dead_letters d
                 WHERE (d.key = $1 AND d.route IS NULL)  -- not event `evt`'s route `b` on `evt#b`'s page
                    OR (d.route IS NOT NULL AND left(d.key, -(length(d.route) + 1)) = $1)),
                '[]') AS dead_letters

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

-- incidents ------------------------------------------------------------------
-- Written by workers (shared.incidents.store.record_failure) in the
-- transaction that records the failure; read and acted on through
-- shared.incidents.store by `webhook-ingest incidents …`, the admin API and
-- the console (docs/oncall.md, "Incidents").

-- name: count_failure_in_incident
-- The failure's incident, made or counted; `change` says whether this
-- failure opened it ('open': new, or reopened after it was resolved).
INSERT INTO incidents (source, handler, fingerprint, error_type, error_pattern, last_error, dead_letters)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (source, handler, fingerprint) DO UPDATE SET
    last_seen = now(),
    failures = incidents.failures + 1,
    dead_letters = incidents.dead_letters + EXCLUDED.dead_letters,
    last_error = EXCLUDED.last_error,
    state = CASE incidents.state WHEN 'resolved' THEN 'open' ELSE incidents.state END,
    opened_at = CASE incidents.state WHEN 'resolved' THEN now() ELSE incidents.opened_at END,
    acknowledged_by = CASE incidents.state WHEN 'resolved' THEN NULL ELSE incidents.acknowledged_by END,
    acknowledged_at = CASE incidents.state WHEN 'resolved' THEN NULL ELSE incidents.acknowledged_at END,
    resolved_by = NULL,
    resolved_at = NULL
RETURNING id, CASE WHEN opened_at = now() THEN 'open' END AS change

-- name: dead_letter_counted
-- Whether dead letter $1 is counted already in the incident of source $2,
-- handler $3 and fingerprint $4: an event's open dead letter recorded again
-- (a copy of an unknown-source event, an attempt run again) is one dead
-- letter, counted once.
SELECT EXISTS (SELECT FROM incident_events e JOIN incidents i ON i.id = e.incident_id
               WHERE e.dead_letter_id = $1 AND (i.source, i.handler, i.fingerprint) = ($2, $3, $4))

-- name: count_incident_event
INSERT INTO incident_events (incident_id, key, event_id, last_attempt, dead_letter_id)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (incident_id, key) DO UPDATE SET
    failures = incident_events.failures + 1,
    last_attempt = greatest(incident_events.last_attempt, EXCLUDED.last_attempt),
    dead_letter_id = coalesce(EXCLUDED.dead_letter_id, incident_events.dead_letter_id),
    last_failed_at = now()

-- name: record_incident_change
INSERT INTO incident_changes (incident_id, state, actor) VALUES ($1, $2, $3)

-- name: list_incidents
-- Unresolved first, then the most recent; $1 state (NULL: every state).
SELECT * FROM incidents
WHERE ($1::text IS NULL OR state = $1)
ORDER BY state = 'resolved', last_seen DESC, id DESC
LIMIT $2

-- name: get_incident
SELECT * FROM incidents WHERE id = $1

-- name: incident_events
-- An incident's events, the latest failure first, with their dead letter's status.
SELECT e.key, e.event_id, e.failures, e.last_attempt, e.dead_letter_id, e.first_failed_at, e.last_failed_at,
       d.status AS dead_letter_status
FROM incident_events e LEFT JOIN dead_letters d ON d.id = e.dead_letter_id
WHERE e.incident_id = $1
ORDER BY e.last_failed_at DESC
LIMIT $2

-- name: incident_history
SELECT state, actor, at FROM incident_changes WHERE incident_id = $1 ORDER BY id

-- name: open_dead_letters_of_incident
SELECT e.dead_letter_id FROM incident_events e JOIN dead_letters d ON d.id = e.dead_letter_id
WHERE e.incident_id = $1 AND d.status = 'dead'
ORDER BY e.dead_letter_id

-- name: change_incident_state
-- Acknowledge ($2 = 'acknowledged': an open incident) or resolve ($2 =
-- 'resolved': an unresolved one) by hand; no row: nothing to change.
UPDATE incidents SET
    state = $2,
    acknowledged_by = CASE WHEN $2 = 'acknowledged' THEN $3 ELSE acknowledged_by END,
    acknowledged_at = CASE WHEN $2 = 'acknowledged' THEN now() ELSE acknowledged_at END,
    resolved_by = CASE WHEN $2 = 'resolved' THEN $3 END,
    resolved_at = CASE WHEN $2 = 'resolved' THEN now() END
WHERE id = $1 AND state <> $2 AND state <> 'resolved'
RETURNING id

-- name: resolve_quiet_incidents
-- Unresolved incidents with no failure for $1 seconds.
UPDATE incidents SET state = 'resolved', resolved_by = 'auto', resolved_at = now()
WHERE state <> 'resolved' AND last_seen < now() - make_interval(secs => $1)
RETURNING id

-- name: count_unresolved_incidents
SELECT count(*) FILTER (WHERE state = 'open') AS open,
       count(*) FILTER (WHERE state = 'acknowledged') AS acknowledged
FROM incidents WHERE state <> 'resolved'

-- name: claim_incident_changes
-- Up to $1 changes to notify, oldest first, claimed by this worker for $2
-- seconds (another worker takes them over after that); acknowledgements
-- are not notified. `reopened`: an earlier change opened the incident.
UPDATE incident_changes c
SET claimed_until = clock_timestamp() + make_interval(secs => $2), attempts = c.attempts + 1
FROM (SELECT id FROM incident_changes
      WHERE notified_at IS NULL AND state <> 'acknowledged' AND claimed_until < clock_timestamp()
      ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED) due
WHERE c.id = due.id
RETURNING c.id, c.incident_id, c.state, c.actor, c.at, c.notified_targets, c.attempts,
          EXISTS (SELECT FROM incident_changes p
                  WHERE p.incident_id = c.incident_id AND p.id < c.id AND p.state = 'open') AS reopened

-- name: incidents_by_id
SELECT * FROM incidents WHERE id = ANY($1::bigint[])

-- name: notified_target
-- One target got change $1; once all $3 have, the change is notified.
UPDATE incident_changes
SET notified_targets = array_append(notified_targets, $2),
    notified_at = CASE WHEN cardinality(notified_targets) + 1 >= $3 THEN now() END
WHERE id = $1 AND NOT $2 = ANY(notified_targets)

-- name: notification_failed
-- Try change $1 again in $2 seconds.
UPDATE incident_changes SET claimed_until = clock_timestamp() + make_interval(secs => $2), last_error = $3
WHERE id = $1

-- name: nothing_to_notify
-- No target is configured: what changes were due are done, and are not
-- sent later to a target configured then.
UPDATE incident_changes SET notified_at = now() WHERE id = ANY($1::bigint[])

-- paused sources (shared/sources/pauses.py) -------------------------------------------

-- name: paused_sources
SELECT source, paused_at, paused_by FROM source_pauses ORDER BY source

-- name: pause_source
INSERT INTO source_pauses (source, paused_by) VALUES ($1, $2) ON CONFLICT (source) DO NOTHING RETURNING source

-- name: resume_source
-- $2, who resumed it, is in the audit log only.
DELETE FROM source_pauses WHERE source = $1 AND $2::text IS NOT NULL RETURNING source

-- name: incident_lock_timeout
-- For the rest of the transaction (a savepoint's rollback undoes it): an
-- incident's row held elsewhere — a partitioned worker's transaction, ~25 s
-- until keepalives end it — costs a failure's count, never the dead letter's
-- commit nor a statement connection for long (adversary round 6, R6-5).
SELECT set_config('lock_timeout', $1, true)

-- replays by selection (shared/replays/store.py) -------------------------
-- The selection is search_archive's filter ($1-$8, the same WHERE), the
-- events it matches by key: one arrival per key (the oldest matched), never
-- an ignored arrival (never queued), a conflicting one (its payload never
-- ran) or one whose body the archive lacks.

-- name: count_event_replay
-- How many events a replay of the filter ($1-$8) would freeze now: the dry
-- run; $9, $10 the sources file's routes.
SELECT count(DISTINCT a.key) FROM event_archive a
CROSS JOIN LATERAL (SELECT a.status = 'queued' AND CASE WHEN a.source = ANY($9::text[])
    THEN EXISTS (SELECT FROM unnest($9::text[], $10::text[]) AS r(source, route)
                 WHERE r.source = a.source AND EXISTS (
                     SELECT FROM key_fences WHERE key_fences.key = a.key || '#' || r.route
                                              AND key_fences.lease_until > clock_timestamp()))
    ELSE EXISTS (SELECT FROM key_fences WHERE key_fences.key = a.key AND key_fences.lease_until > clock_timestamp())
    END AS processing) held
WHERE ($1::text IS NULL OR a.source = $1)
  AND ($2::text IS NULL OR CASE $2 WHEN 'processing' THEN a.status = 'queued' AND held.processing
                                  WHEN 'queued' THEN a.status = 'queued' AND NOT held.processing
                                  ELSE a.status = $2 END)
  AND ($3::text IS NULL OR a.event_type = $3)
  AND ($4::timestamptz IS NULL OR a.received_at >= $4)
  AND ($5::timestamptz IS NULL OR a.received_at < $5)
  AND ($6::text IS NULL OR starts_with(a.key, $6))
  AND ($6::text IS NULL OR strpos($6, ':') = 0 OR a.source = split_part($6, ':', 1))
  AND ($6::text IS NULL OR strpos($6, ':') = 0 OR starts_with(a.event_id, substr($6, strpos($6, ':') + 1)))
  AND ($7::text IS NULL OR starts_with(a.event_id, $7))
  AND ($8::jsonb IS NULL OR event_archive_payload(a.body) @> $8)
  AND a.status NOT IN ('ignored', 'conflict') AND a.body IS NOT NULL

-- name: insert_event_replay
-- A replay of the filter ($1-$8) frozen now, asked by $9 with its filter as
-- $10 ($11, $12 the sources file's routes): the replay's row and its items, numbered in the order received, in
-- one statement (one snapshot: what the count said is what is frozen).
WITH selected AS (
    SELECT DISTINCT ON (a.key) a.source, a.key, a.received_at FROM event_archive a
    CROSS JOIN LATERAL (SELECT a.status = 'queued' AND CASE WHEN a.source = ANY($11::text[])
        THEN EXISTS (SELECT FROM unnest($11::text[], $12::text[]) AS r(source, route)
                     WHERE r.source = a.source AND EXISTS (
                         SELECT FROM key_fences WHERE key_fences.key = a.key || '#' || r.route
                                                  AND key_fences.lease_until > clock_timestamp()))
        ELSE EXISTS (SELECT FROM key_fences WHERE key_fences.key = a.key AND key_fences.lease_until > clock_timestamp())
        END AS processing) held
    WHERE ($1::text IS NULL OR a.source = $1)
      AND ($2::text IS NULL OR CASE $2 WHEN 'processing' THEN a.status = 'queued' AND held.processing
                                      WHEN 'queued' THEN a.status = 'queued' AND NOT held.processing
                                      ELSE a.status = $2 END)
      AND ($3::text IS NULL OR a.event_type = $3)
      AND ($4::timestamptz IS NULL OR a.received_at >= $4)
      AND ($5::timestamptz IS NULL OR a.received_at < $5)
      AND ($6::text IS NULL OR starts_with(a.key, $6))
      AND ($6::text IS NULL OR strpos($6, ':') = 0 OR a.source = split_part($6, ':', 1))
      AND ($6::text IS NULL OR strpos($6, ':') = 0 OR starts_with(a.event_id, substr($6, strpos($6, ':') + 1)))
      AND ($7::text IS NULL OR starts_with(a.event_id, $7))
      AND ($8::jsonb IS NULL OR event_archive_payload(a.body) @> $8)
      AND a.status NOT IN ('ignored', 'conflict') AND a.body IS NOT NULL
    ORDER BY a.key, a.received_at
), replay AS (
    INSERT INTO event_replays (filter, total, created_by)
    SELECT $10::jsonb, count(*), $9 FROM selected
    RETURNING id
), items AS (
    INSERT INTO event_replay_items (replay_id, item, source, key, received_at)
    SELECT replay.id, row_number() OVER (ORDER BY s.received_at, s.source, s.key), s.source, s.key, s.received_at
    FROM replay, selected s
)
SELECT id FROM replay

-- name: get_event_replay
-- The replay, and whether a Cancel counted an item published that its
-- runner, dead mid-publish, never stepped (cancel_event_replay).
SELECT r.*, coalesce(f.in_doubt, false) AS in_doubt FROM event_replays r
LEFT JOIN paced_run_in_flight f ON f.kind = 'event_replay' AND f.run_id = r.id
WHERE r.id = $1

-- name: event_replay_items
-- Items $2 and after of replay $1, in order, at most $3.
SELECT item, source, key, received_at FROM event_replay_items
WHERE replay_id = $1 AND item >= $2 ORDER BY item LIMIT $3

-- name: event_replay_arrival
-- What a replay publishes of one frozen item: its arrival as archived (of
-- arrivals sharing its millisecond, one the selection could have chosen).
SELECT source, key, received_at, event_id, payload_sha256, body, headers FROM event_archive
WHERE source = $1 AND key = $2 AND received_at = $3
ORDER BY body IS NULL, status IN ('ignored', 'conflict'), arrival LIMIT 1

-- name: claim_event_replay
-- Start (or resume) at $2 per second: only one process runs it. A run whose
-- process died (no step for 30 s plus two of its intervals) may be resumed.
UPDATE event_replays
SET state = 'running', rate = $2, error = NULL, started_at = coalesce(started_at, now()), stepped_at = now()
WHERE id = $1 AND (state IN ('prepared', 'failed')
                   OR (state = 'running' AND stepped_at < now() - make_interval(secs => 30 + 2 / rate)))
RETURNING *

-- name: event_replay_step
-- Item $2 handled: published ($3 true) or skipped. Only in order, once, and
-- only by the runner whose last step (or claim) wrote stepped_at $4: a
-- runner whose stalled run was claimed again elsewhere gets no row back.
UPDATE event_replays
SET next_item = $2 + 1, published = published + $3::boolean::integer,
    skipped = skipped + (NOT $3)::integer, stepped_at = now()
WHERE id = $1 AND next_item = $2 AND stepped_at = $4
RETURNING stepped_at

-- name: finish_event_replay
-- By the runner that holds it ($4: its last stepped_at), never by one whose run was claimed again.
UPDATE event_replays SET state = $2, error = $3, finished_at = now()
WHERE id = $1 AND state = 'running' AND stepped_at = $4

-- name: cancel_event_replay
-- Under the run's lock (shared/runs/locks.py: no runner is mid-item). An item
-- marked in flight and not stepped (its runner died, or its publish failed,
-- once it may have been sent) is counted published and handled, and marked
-- in doubt: what a cancel reports published is all that can have gone out.
WITH run AS (
    SELECT r.id, f.item IS NOT NULL AS in_doubt FROM event_replays r
    LEFT JOIN paced_run_in_flight f ON f.kind = 'event_replay' AND f.run_id = r.id AND f.item = r.next_item
    WHERE r.id = $1 AND r.state IN ('prepared', 'running', 'failed')
), doubted AS (
    UPDATE paced_run_in_flight f SET in_doubt = true FROM run
    WHERE f.kind = 'event_replay' AND f.run_id = run.id AND run.in_doubt
)
UPDATE event_replays r SET state = 'cancelled', finished_at = now(),
    next_item = r.next_item + run.in_doubt::integer, published = r.published + run.in_doubt::integer
FROM run WHERE r.id = run.id
RETURNING r.id, run.in_doubt

-- name: event_replay_in_flight
-- Item $2 of replay $1 about to be published, committed before its publish
-- (cancel_event_replay reads it when the runner never stepped it). Once in
-- doubt, a replay stays so: its published count holds one that may not
-- have gone out.
INSERT INTO paced_run_in_flight (kind, run_id, item) VALUES ('event_replay', $1, $2)
ON CONFLICT (kind, run_id) DO UPDATE SET item = EXCLUDED.item, marked_at = now()

-- name: event_replay_doubted
-- A replay counted an item published that may not have gone out: its
-- runner died with it in flight, and its successor skipped it.
UPDATE paced_run_in_flight SET in_doubt = true WHERE kind = 'event_replay' AND run_id = $1

-- name: lock_event_replay
-- The runner's hold of its replay for one item: the state it acts on, and
-- the row locked until the item's step commits (a cancel waits for it).
-- `orphaned`: the item is marked in flight by a runner that never stepped it.
SELECT r.state, r.stepped_at, f.item IS NOT NULL AS orphaned FROM event_replays r
LEFT JOIN paced_run_in_flight f ON f.kind = 'event_replay' AND f.run_id = r.id AND f.item = r.next_item
WHERE r.id = $1 FOR UPDATE OF r


-- name: replays_of_event
-- The replays by selection whose frozen items hold the key $1, newest first,
-- at most $2: each replay's state, who asked, whether its item was handled
-- (published or skipped), its run's completion (under replay-R/KEY) and,
-- for a source with routes ($3, its route names in the file's order), each
-- route's run's (replay-R/KEY#ROUTE), null when not completed. A completion
-- is the event's only with its event id (KEY's after SOURCE:): event `evt`'s
-- route `b` completes under event `evt#b`'s key (docs/design.md, "Routes").
SELECT r.id, r.state, r.created_by, r.created_at, r.next_item > i.item AS handled,
       (SELECT p.completed_at FROM processed_events p
        WHERE p.key = 'replay-' || r.id || '/' || i.key AND p.event_id = substr($1, strpos($1, ':') + 1))
           AS completed_at,
       array(SELECT (SELECT p.completed_at FROM processed_events p
                     WHERE p.key = 'replay-' || r.id || '/' || i.key || '#' || route.name
                       AND p.event_id = substr($1, strpos($1, ':') + 1))
             FROM unnest($3::text[]) WITH ORDINALITY AS route(name, place)
             ORDER BY route.place) AS route_completed_at
FROM event_replay_items i
JOIN event_replays r ON r.id = i.replay_id
WHERE i.key = $1
ORDER BY r.id DESC
LIMIT $2

-- pruning the frozen selections of ended replays (shared/upkeep.py) ----
-- An item of a replay that ended (`done` or `cancelled`: never claimed
-- again) a while ago goes once no arrival of its key is archived: then its
-- event has no page, the one place an ended replay's items show (its
-- progress is the replay's row). Each replay is walked in passes
-- (event_replay_prune_passes, migration 0025): a statement reads the next
-- page of items from the pass's position, deletes the gone ones, skips the
-- archived ones and moves the position past the page, so an archived item
-- never holds back the ones after it. Past the last item, the pass is over;
-- the next begins at the first item left no sooner than $3 seconds after
-- it began, to read the skipped items again.

-- name: event_replays_to_prune
-- The replays that ended more than $1 seconds ago with items left that a
-- pass has still to read: none begun, one under way, or one over that
-- began more than $3 seconds ago; oldest first, at most $2.
-- The last item left read as max(): one backward probe of the items' primary key per replay,
-- whatever the statistics say (an EXISTS became a seq scan each when one replay held every item).
SELECT r.id FROM event_replays r
LEFT JOIN event_replay_prune_passes p ON p.replay_id = r.id
CROSS JOIN LATERAL (SELECT max(i.item) AS item FROM event_replay_items i WHERE i.replay_id = r.id) last
WHERE r.state IN ('done', 'cancelled') AND r.finished_at < now() - make_interval(secs => $1)
  AND last.item IS NOT NULL
  AND (last.item >= p.next_item
       OR p.replay_id IS NULL OR p.pass_started_at < now() - make_interval(secs => $3))
ORDER BY r.id
LIMIT $2

-- name: prune_event_replay_items
-- Of replay $1, if it ended more than $2 seconds ago, the next $3 items of
-- its pass (from its position; from the first item left when none has
-- begun, or when the last is over and began more than $4 seconds ago):
-- those whose event is no longer archived deleted, the others skipped, the
-- pass's position moved past them. Items another process is reading are
-- left to it (SKIP LOCKED), so upkeeps at once share the work; the
-- position only moves forward within a pass (GREATEST), and a new pass is
-- begun once (the pass row read must be the one still there); a statement
-- that read the last pass leaves a new one's position alone (its page was
-- the last pass's). How many were deleted and how many read.
WITH pass AS (
    SELECT CASE WHEN p.replay_id IS NULL THEN 1
                WHEN EXISTS (SELECT FROM event_replay_items i WHERE i.replay_id = r.id AND i.item >= p.next_item)
                    THEN p.next_item
                WHEN p.pass_started_at < now() - make_interval(secs => $4) THEN 1
           END AS start,
           p.replay_id IS NULL OR NOT EXISTS (SELECT FROM event_replay_items i
                                              WHERE i.replay_id = r.id AND i.item >= p.next_item) AS begins,
           p.pass_started_at AS began
    FROM event_replays r
    LEFT JOIN event_replay_prune_passes p ON p.replay_id = r.id
    WHERE r.id = $1 AND r.state IN ('done', 'cancelled') AND r.finished_at < now() - make_interval(secs => $2)
), page AS (
    SELECT i.item, i.source, i.key FROM event_replay_items i
    WHERE i.replay_id = $1 AND i.item >= (SELECT start FROM pass)  -- a bound of the index's range
    ORDER BY i.item
    LIMIT $3
    FOR UPDATE OF i SKIP LOCKED
), judged AS (
    SELECT page.item, EXISTS (SELECT FROM event_archive a WHERE a.source = page.source AND a.key = page.key) AS archived
    FROM page
), deleted AS (
    DELETE FROM event_replay_items i USING judged
    WHERE i.replay_id = $1 AND i.item = judged.item AND NOT judged.archived
    RETURNING i.item
), moved AS (
    INSERT INTO event_replay_prune_passes AS p (replay_id, next_item)
    SELECT $1, coalesce((SELECT max(item) + 1 FROM judged), pass.start) FROM pass WHERE pass.start IS NOT NULL
    ON CONFLICT (replay_id) DO UPDATE
    SET next_item = CASE WHEN (SELECT begins FROM pass) AND p.pass_started_at = (SELECT began FROM pass)
                             THEN EXCLUDED.next_item
                         -- read in the last pass, and the next began since: its position is not this one's
                         WHEN NOT (SELECT begins FROM pass) AND p.pass_started_at <> (SELECT began FROM pass)
                             THEN p.next_item
                         ELSE greatest(p.next_item, EXCLUDED.next_item) END,
        pass_started_at = CASE WHEN (SELECT begins FROM pass) AND p.pass_started_at = (SELECT began FROM pass)
                               THEN now() ELSE p.pass_started_at END
)
SELECT (SELECT count(*) FROM deleted) AS deleted, count(*) AS read FROM judged

-- workers report themselves (shared/worker_heartbeats.py) ------------------------

-- name: worker_beat
-- A worker's beat, one statement: its row made or brought up to date
-- ($7: it stops cleanly), its outcomes since its last beat added to this
-- minute's, and the rows of workers not seen for $18 seconds and the
-- minutes older than $19 deleted — each taken with SKIP LOCKED, so beats
-- of two workers never wait on each other nor deadlock.
WITH beat AS (
    INSERT INTO worker_heartbeats AS w (worker_id, name, host, pid, started_at, beat_seconds, stopped_at, in_flight,
                                        keys_held, pool_in_use, pool_size, degraded)
    VALUES ($1, $2, $3, $4, $5, $6, CASE WHEN $7::boolean THEN now() END, $8, $9, $10, $11, $12)
    ON CONFLICT (worker_id) DO UPDATE SET
        name = EXCLUDED.name, host = EXCLUDED.host, pid = EXCLUDED.pid, started_at = EXCLUDED.started_at,
        last_seen = now(), beat_seconds = EXCLUDED.beat_seconds, stopped_at = EXCLUDED.stopped_at,
        in_flight = EXCLUDED.in_flight, keys_held = EXCLUDED.keys_held, pool_in_use = EXCLUDED.pool_in_use,
        pool_size = EXCLUDED.pool_size, degraded = EXCLUDED.degraded
), counted AS (
    INSERT INTO worker_minutes AS m (minute, worker_id, processed, retried, dead, duplicate, lease_losses)
    SELECT date_trunc('minute', now()), $1, $13::integer, $14::integer, $15::integer, $16::integer, $17::integer
    WHERE $13::integer + $14::integer + $15::integer + $16::integer + $17::integer > 0
    ON CONFLICT (minute, worker_id) DO UPDATE SET
        processed = m.processed + EXCLUDED.processed, retried = m.retried + EXCLUDED.retried,
        dead = m.dead + EXCLUDED.dead, duplicate = m.duplicate + EXCLUDED.duplicate,
        lease_losses = m.lease_losses + EXCLUDED.lease_losses
), gone AS (
    DELETE FROM worker_heartbeats WHERE worker_id IN (
        SELECT worker_id FROM worker_heartbeats
        WHERE worker_id <> $1 AND last_seen < now() - $18::float8 * interval '1 second'
        FOR UPDATE SKIP LOCKED)
), old AS (
    DELETE FROM worker_minutes WHERE (minute, worker_id) IN (
        SELECT minute, worker_id FROM worker_minutes WHERE minute < now() - $19::float8 * interval '1 second'
        FOR UPDATE SKIP LOCKED)
)
SELECT now()

-- name: workers_seen
-- The console's workers, live first: how long since each one's last beat,
-- silent when that is more than $1 of its own intervals (and it did not
-- stop), and its lease losses and retries in the minutes since $2 minutes
-- before this one.
SELECT w.worker_id, w.name, w.host, w.pid, w.started_at, w.stopped_at, w.in_flight, w.keys_held,
       w.pool_in_use, w.pool_size, w.degraded,
       extract(epoch FROM now() - w.last_seen)::float8 AS seen_seconds_ago,
       w.stopped_at IS NULL AND now() - w.last_seen > $1::float8 * w.beat_seconds * interval '1 second' AS silent,
       coalesce(r.lease_losses, 0)::integer AS recent_lease_losses, coalesce(r.retried, 0)::integer AS recent_retried
FROM worker_heartbeats w
LEFT JOIN (SELECT worker_id, sum(lease_losses) AS lease_losses, sum(retried) AS retried
           FROM worker_minutes WHERE minute >= date_trunc('minute', now()) - $2::integer * interval '1 minute'
           GROUP BY worker_id) r USING (worker_id)
ORDER BY w.stopped_at IS NOT NULL, w.name, w.host, w.pid

-- name: workers_at_a_glance
-- The ingress's gauges: workers silent (no beat for $1 of their intervals,
-- not stopped) and live workers that report Redis degraded.
SELECT count(*) FILTER (WHERE stopped_at IS NULL
                          AND now() - last_seen > $1::float8 * beat_seconds * interval '1 second') AS silent,
       count(*) FILTER (WHERE stopped_at IS NULL AND degraded
                          AND now() - last_seen <= $1::float8 * beat_seconds * interval '1 second') AS degraded
FROM worker_heartbeats

-- name: outcomes_by_minute
-- Every worker's outcomes in each of the last $1 minutes, this one
-- included, oldest first; a minute nobody reported is all zeros.
SELECT s.minute, coalesce(sum(m.processed), 0)::integer AS processed, coalesce(sum(m.retried), 0)::integer AS retried,
       coalesce(sum(m.dead), 0)::integer AS dead, coalesce(sum(m.duplicate), 0)::integer AS duplicate
FROM generate_series(date_trunc('minute', now()) - ($1::integer - 1) * interval '1 minute',
                     date_trunc('minute', now()), interval '1 minute') AS s(minute)
LEFT JOIN worker_minutes m ON m.minute = s.minute
GROUP BY s.minute
ORDER BY s.minute

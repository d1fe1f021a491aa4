-- name: take_turn
-- The key's turn in Postgres: a transaction-scoped advisory lock, without
-- waiting. Every run takes it, Redis-locked or degraded, and keeps it until
-- its transaction ends (also when its session dies): the mutual exclusion
-- that holds whatever Redis forgets (docs/design.md, "Exclusion").
SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))

-- name: take_turns
-- take_turn for a batch of distinct keys; the keys whose turn we got.
SELECT key FROM unnest($1::text[]) AS batch(key)
WHERE pg_try_advisory_xact_lock(hashtextextended(key, 0))

-- name: take_leases
-- The key's lease and a new fencing token (the sequence only grows), for
-- each of the distinct keys $1 whose lease is free or ran out; $2: the
-- lease's length in ms. One autocommit statement, before the turn's
-- transaction, so the lease outlives its holder's session
-- (workers/claim/lease.py). Returns the keys granted, with their tokens and the
-- last attempt handed on (workers/claim/attempts.py).
INSERT INTO key_fences (key, token, lease_until)
SELECT key, nextval('fencing_tokens'), clock_timestamp() + $2 * interval '1 millisecond'
FROM unnest($1::text[]) AS batch(key) ORDER BY key
ON CONFLICT (key) DO UPDATE
    SET token = EXCLUDED.token, lease_until = EXCLUDED.lease_until, updated_at = now()
    WHERE key_fences.lease_until IS NULL OR key_fences.lease_until < clock_timestamp()
RETURNING key, token, replay_of, attempt, payload_sha256

-- name: extend_leases
-- Our leases ($1 keys, $2 tokens) run $3 ms longer, if still ours and not
-- ended by a completion; returns those extended. Every statement that
-- locks several fence rows locks them in key order first, as take_leases
-- does (a SELECT ... ORDER BY key FOR UPDATE: its LockRows sits above the
-- Sort), so two never wait for each other's rows (docs/design.md,
-- "One lock order"). A row whose token changed while we waited for it is
-- checked again and left out. `key = ANY($1)`, implied by the join, keeps
-- the fence rows read by their index whatever plan the statement keeps:
-- a generic plan made while the table was small (a new deployment, its
-- statistics behind) joined it by a sequential scan, every row every time.
WITH ours AS (
    SELECT key_fences.key FROM key_fences
    JOIN unnest($1::text[], $2::bigint[]) AS ours(key, token)
        ON key_fences.key = ours.key AND key_fences.token = ours.token
    WHERE key_fences.lease_until IS NOT NULL AND key_fences.key = ANY($1::text[])
    ORDER BY key_fences.key FOR UPDATE OF key_fences
)
UPDATE key_fences SET lease_until = clock_timestamp() + $3 * interval '1 millisecond'
FROM ours WHERE key_fences.key = ours.key AND key_fences.key = ANY($1::text[])
RETURNING key_fences.key, key_fences.token

-- name: release_leases
-- Our leases ($1 keys, $2 tokens) end; rows locked in key order, read by
-- their index (extend_leases).
WITH ours AS (
    SELECT key_fences.key FROM key_fences
    JOIN unnest($1::text[], $2::bigint[]) AS ours(key, token)
        ON key_fences.key = ours.key AND key_fences.token = ours.token
    WHERE key_fences.key = ANY($1::text[])
    ORDER BY key_fences.key FOR UPDATE OF key_fences
)
UPDATE key_fences SET lease_until = NULL
FROM ours WHERE key_fences.key = ours.key AND key_fences.key = ANY($1::text[])

-- name: record_handed_on
-- Attempt $3 of chain $2 (workers/claim/attempts.py), payload $4, of arrival $5
-- (0: none; migration 0023) was handed on: its retry message is confirmed
-- or its dead letter committed. Only ever moves forward. A key without a
-- fence row (a message the delivery limit stopped before any run took a
-- lease) gets one, its lease free.
INSERT INTO key_fences (key, token, replay_of, attempt, payload_sha256, arrival)
VALUES ($1, nextval('fencing_tokens'), $2, $3, $4, nullif($5::int8, 0))
ON CONFLICT (key) DO UPDATE
    SET replay_of = $2, attempt = $3, payload_sha256 = $4, arrival = nullif($5::int8, 0), updated_at = now()
WHERE key_fences.replay_of < $2 OR (key_fences.replay_of = $2 AND key_fences.attempt < $3)

-- name: completed_keys
-- Which of the keys $1 are completed, with their payload hash. Run under
-- the turn, as its own statement: its snapshot is taken after the previous
-- holder's commit, so it sees that completion.
SELECT key, payload_sha256 FROM processed_events WHERE key = ANY($1::text[])

-- name: complete_event
-- The completion, in the handler's transaction: inserted only while our
-- fencing token is the key's current one and the key is not completed
-- yet; it ends our lease in the same commit. An ordered row's ($9: its lane,
-- NULL for none; $10: the lane holder's token; $11: its seq; $12: its `by`;
-- $13: stale, completed unrun) also advances its lane in that commit — row
-- deleted, `pending - 1`, `last_by` raised unless stale — and only while $10
-- is the lane's token: else nothing is written (docs/design.md, "Ordering
-- keys"). The fence row is locked before the lane's ("One lock order").
WITH fence AS (
    SELECT key FROM key_fences WHERE key = $1 AND token = $5 FOR UPDATE
), lane_held AS (
    SELECT lane FROM ordering_keys
    WHERE $9::text IS NOT NULL AND lane = $9 AND token = $10 AND EXISTS (SELECT FROM fence)
    FOR UPDATE
), ended AS (
    UPDATE key_fences SET lease_until = NULL
    WHERE key IN (SELECT key FROM fence) AND ($9::text IS NULL OR EXISTS (SELECT FROM lane_held))
    RETURNING token
), finished AS (
    DELETE FROM ordered_events
    WHERE lane = $9 AND seq = $11 AND state = 'pending' AND EXISTS (SELECT FROM ended)
    RETURNING lane
), advanced AS (
    UPDATE ordering_keys
    SET pending = pending - 1, updated_at = now(),
        last_by = CASE WHEN $13::bool OR $12::numeric IS NULL THEN last_by ELSE greatest(last_by, $12::numeric) END
    WHERE lane IN (SELECT lane FROM finished)
), resolved AS (  -- another copy's chain dead-lettered it: that row is closed, not left open
    -- (only this event's: a route's run and an event whose id ends in '#ROUTE' share a key, not an event id)
    UPDATE dead_letters SET status = 'completed', updated_at = now()
    WHERE key = $1 AND payload_sha256 = $4 AND event_id = $3 AND status = 'dead' AND EXISTS (SELECT FROM ended)
)
INSERT INTO processed_events (key, source, event_id, payload_sha256, fencing_token, attempts, message_id, arrival, stale)
SELECT $1, $2, $3, $4, $5, $6, $7, $8, $13::bool FROM ended
ON CONFLICT (key) DO NOTHING
RETURNING key

-- name: completed_sha256
-- The payload hash the key completed with, NULL while it has not.
SELECT payload_sha256 FROM processed_events WHERE key = $1

-- name: record_conflict
INSERT INTO event_conflicts (key, source, event_id, completed_sha256, conflicting_sha256)
VALUES ($1, $2, $3, $4, $5)

-- name: insert_inbox
-- Idempotent on its own: a copy that arrives after `prune` forgot the key is
-- processed again (docs/reference.md §2, `prune`), and keeps the first row.
INSERT INTO inbox (key, source, event_id, payload, received_at)
VALUES ($1, $2, $3, $4::jsonb, $5)
ON CONFLICT (key) DO NOTHING

-- name: insert_inbox_many
-- insert_inbox for a batch's events (`inbox`'s batch form): their keys are
-- distinct; $4 their payloads as JSON text.
INSERT INTO inbox (key, source, event_id, payload, received_at)
SELECT key, source, event_id, payload::jsonb, received_at
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::timestamptz[])
    AS batch(key, source, event_id, payload, received_at)
ON CONFLICT (key) DO NOTHING

-- name: complete_events
-- complete_event for a batch: rows whose token is still the key's current
-- one and not completed yet; ends their leases; returns the keys it
-- inserted. Fence rows locked in key order, read by their index
-- (extend_leases), then the lanes
-- of the ordered ones ($9..$13 as complete_event's, per row; a lane NULL:
-- not ordered) in lane order: an ordered row completes only while its lane's
-- token is the holder's, and advances its lane in the same commit.
WITH batch AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::int[], $7::text[],
                         $8::bigint[], $9::text[], $10::bigint[], $11::bigint[], $12::numeric[], $13::bool[])
        AS b(key, source, event_id, payload_sha256, fencing_token, attempts, message_id, arrival,
             lane, lane_token, seq, by_value, stale)
), locked AS (
    SELECT key_fences.key FROM key_fences JOIN batch
        ON key_fences.key = batch.key AND key_fences.token = batch.fencing_token
    WHERE key_fences.key = ANY($1::text[])
    ORDER BY key_fences.key FOR UPDATE OF key_fences
), lanes_held AS (
    SELECT ordering_keys.lane FROM ordering_keys JOIN batch
        ON ordering_keys.lane = batch.lane AND ordering_keys.token = batch.lane_token
    WHERE batch.key IN (SELECT key FROM locked)
    ORDER BY ordering_keys.lane FOR UPDATE OF ordering_keys
), fence AS (
    UPDATE key_fences SET lease_until = NULL FROM locked JOIN batch USING (key)
    WHERE key_fences.key = locked.key AND key_fences.key = ANY($1::text[])
      AND (batch.lane IS NULL OR batch.lane IN (SELECT lane FROM lanes_held))
    RETURNING key_fences.key
), finished AS (
    DELETE FROM ordered_events USING batch
    WHERE ordered_events.lane = batch.lane AND ordered_events.seq = batch.seq AND ordered_events.state = 'pending'
      AND batch.key IN (SELECT key FROM fence)
    RETURNING ordered_events.lane, batch.by_value, batch.stale
), advanced AS (
    UPDATE ordering_keys
    SET pending = pending - steps.rows, updated_at = now(), last_by = coalesce(greatest(last_by, steps.top), last_by)
    FROM (SELECT lane, count(*) AS rows, max(by_value) FILTER (WHERE NOT stale) AS top FROM finished GROUP BY lane)
        AS steps
    WHERE ordering_keys.lane = steps.lane
), resolved AS (
    UPDATE dead_letters SET status = 'completed', updated_at = now() FROM batch
    WHERE dead_letters.key = batch.key AND dead_letters.payload_sha256 = batch.payload_sha256
      AND dead_letters.event_id = batch.event_id  -- only this event's (complete_event says why)
      AND dead_letters.status = 'dead' AND batch.key IN (SELECT key FROM fence)
)
INSERT INTO processed_events (key, source, event_id, payload_sha256, fencing_token, attempts, message_id, arrival, stale)
SELECT key, source, event_id, payload_sha256, fencing_token, attempts, message_id, arrival, stale
FROM batch JOIN fence USING (key)
ON CONFLICT (key) DO NOTHING
RETURNING key

-- name: settled_before
-- A redelivered message (its worker died before the ack): did its own
-- earlier delivery complete the event ($3: its message id), or is the event
-- an open dead letter already? Either way it is settled; ack it.
SELECT coalesce((SELECT message_id FROM processed_events WHERE key = $1) = $3, false) AS completed,
       EXISTS (SELECT FROM dead_letters WHERE key = $1 AND payload_sha256 = $2 AND status = 'dead') AS dead

-- name: writable
-- The outage probe: up means writable (a demoted primary answers reads but
-- refuses every write).
SELECT NOT pg_is_in_recovery() AND current_setting('transaction_read_only') = 'off'

-- retention (webhook-ingest prune) --------------------------------------------
-- Each block deletes one batch; the caller loops, one short transaction per
-- batch, so pruning never holds locks on many rows at once.

-- name: retention_cutoff
SELECT now() - $1::interval

-- name: prune_completed_events
-- The outer condition is repeated on purpose: when a row changed while the
-- DELETE waited for its lock, Postgres re-checks only the outer WHERE on the
-- new version (a fence a worker just refreshed must survive).
-- The keys' attempt records (workers/claim/attempts.py) go with their completions:
-- a copy after the retention window is processed again, not taken for a
-- copy of an attempt of the forgotten chain. Their fence rows are locked in
-- key order (extend_leases). What went is returned: the archive's rows of
-- those events still unsettled are settled from it in the same transaction
-- (ArchiveStore.settle_pruned).
WITH doomed AS (
    SELECT key FROM processed_events WHERE completed_at < $1 LIMIT $2
), fences AS (
    SELECT key FROM key_fences WHERE key IN (SELECT key FROM doomed) ORDER BY key FOR UPDATE
), forgotten AS (
    UPDATE key_fences SET replay_of = 0, attempt = 0, payload_sha256 = NULL, arrival = NULL
    WHERE key IN (SELECT key FROM fences)
)
DELETE FROM processed_events
WHERE key IN (SELECT key FROM doomed)
  AND completed_at < $1
RETURNING key, source, event_id, payload_sha256, attempts, completed_at, arrival, stale

-- name: prune_key_fences
-- Rows locked in key order (extend_leases), each checked again once locked.
WITH doomed AS (
    SELECT key FROM key_fences
    WHERE key IN (SELECT key FROM key_fences WHERE updated_at < $1 LIMIT $2)
      AND updated_at < $1 AND (lease_until IS NULL OR lease_until < now())
    ORDER BY key FOR UPDATE
)
DELETE FROM key_fences
WHERE key IN (SELECT key FROM doomed)
  AND updated_at < $1 AND (lease_until IS NULL OR lease_until < now())

-- name: prune_idle_lanes
-- Ordering keys' lanes idle since $1 (docs/design.md, "Ordering keys"):
-- nothing pending, no live holder, not blocked, and no row of theirs left
-- (a dead row a lane skipped keeps it: its seqs go on after that row's).
-- Locked in lane order (shared/ordering/queries.sql), each checked again
-- once locked on its own columns: every statement that changes a lane's
-- rows sets its `updated_at` (an insert, a dead row, a replay in place)
-- under the same row lock, so an insert that got the lane first leaves it
-- pending and touched, and one that comes after finds no row and makes the
-- lane anew — its seqs from 1, with no row left to meet or to run before.
WITH doomed AS (
    SELECT lane FROM ordering_keys
    WHERE pending = 0 AND blocked_by IS NULL AND updated_at < $1 AND (lease_until IS NULL OR lease_until < now())
      AND NOT EXISTS (SELECT FROM ordered_events WHERE ordered_events.lane = ordering_keys.lane)
    ORDER BY lane LIMIT $2 FOR UPDATE
)
DELETE FROM ordering_keys
WHERE lane IN (SELECT lane FROM doomed)
  AND pending = 0 AND blocked_by IS NULL AND updated_at < $1 AND (lease_until IS NULL OR lease_until < now())

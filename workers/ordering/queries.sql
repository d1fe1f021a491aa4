-- A lane's holder's statements (workers/ordering/store.py): take, extend,
-- page, finish, retry, dead, release, and the watchdog's look for lanes to
-- take (docs/design.md, "Ordering keys"). The completion's advance is
-- CompletionStore's (workers/queries.sql, complete_event[s]). Lock order
-- (shared/ordering/queries.sql): several lanes in lane order; a lane's row
-- before its pending rows; key_fences before ordering_keys.

-- name: take_lane
-- The lane $1's lease, for holder $2 (a worker's name), $3 ms, with a new
-- fencing token: granted while the lane has rows pending, is not blocked,
-- its lease is free or ran out, and its `ready_at` (a retry's delay, a hold)
-- has come — all read on the locked row, by Postgres's clock. Returns the
-- token, and whether the previous lease ran out rather than being released:
-- then its head (the row its holder was running, likely) counts one more
-- delivery, so a head that kills its worker every time ends a dead letter
-- past the delivery limit (workers/ordering/runner.py). Lane row, then its row.
WITH old AS (
    SELECT lane, holder, lease_until FROM ordering_keys WHERE lane = $1 FOR UPDATE
), taken AS (
    UPDATE ordering_keys
    SET token = nextval('fencing_tokens'), holder = $2,
        lease_until = clock_timestamp() + $3 * interval '1 millisecond', ready_at = NULL, updated_at = now()
    FROM old
    WHERE ordering_keys.lane = old.lane AND pending > 0 AND blocked_by IS NULL
      AND (ordering_keys.lease_until IS NULL OR ordering_keys.lease_until < clock_timestamp())
      AND (ready_at IS NULL OR ready_at <= clock_timestamp())
    RETURNING ordering_keys.token, old.holder IS NOT NULL AND old.lease_until IS NOT NULL AS expired
), head AS (
    UPDATE ordered_events SET deliveries = deliveries + 1
    WHERE lane = $1 AND state = 'pending' AND EXISTS (SELECT FROM taken WHERE expired)
      AND seq = (SELECT seq FROM ordered_events WHERE lane = $1 AND state = 'pending'
                 ORDER BY by_value NULLS LAST, seq LIMIT 1)
)
SELECT token, expired FROM taken

-- name: extend_lanes
-- Our lanes' leases ($1 lanes, $2 tokens) run $3 ms longer while still ours;
-- returns those extended. Rows locked in lane order.
WITH ours AS (
    SELECT ordering_keys.lane FROM ordering_keys
    JOIN unnest($1::text[], $2::bigint[]) AS ours(lane, token)
        ON ordering_keys.lane = ours.lane AND ordering_keys.token = ours.token
    WHERE ordering_keys.lease_until IS NOT NULL
    ORDER BY ordering_keys.lane FOR UPDATE OF ordering_keys
)
UPDATE ordering_keys SET lease_until = clock_timestamp() + $3 * interval '1 millisecond'
FROM ours WHERE ordering_keys.lane = ours.lane
RETURNING ordering_keys.lane, ordering_keys.token

-- name: page
-- The lane $1's next $3 pending rows in run order (`by`, then seq), with
-- whether $2 is still the lane's token, its `last_by`, and, when its source
-- holds ($4 seconds > 0), how long until its earliest-accepted pending row
-- has waited the hold (Postgres's clock; <= 0: due). No lane: no row.
WITH lane_row AS (
    SELECT last_by, token = $2 AND lease_until IS NOT NULL AS ours FROM ordering_keys WHERE lane = $1
), due AS (
    SELECT extract(epoch FROM min(accepted_at) + $4 * interval '1 second' - clock_timestamp())::float8 AS due_in
    FROM ordered_events WHERE $4 > 0 AND lane = $1 AND state = 'pending'
)
SELECT lane_row.ours, lane_row.last_by, due.due_in, rows.*
FROM lane_row CROSS JOIN due
LEFT JOIN LATERAL (
    SELECT seq, by_value, body, amqp_headers, attempt, replay_of, errors, deliveries
    FROM ordered_events WHERE lane = $1 AND state = 'pending'
    ORDER BY by_value NULLS LAST, seq
    LIMIT $3
) AS rows ON true
ORDER BY rows.by_value NULLS LAST, rows.seq

-- name: finish
-- Row $3 of lane $1 done without a completion of ours (another copy, another
-- lane, completed the event): deleted, `pending - 1`, while $2 is the lane's
-- token. Returns whether it still is.
WITH lane_held AS (
    SELECT lane FROM ordering_keys WHERE lane = $1 AND token = $2 AND lease_until IS NOT NULL FOR UPDATE
), finished AS (
    DELETE FROM ordered_events
    WHERE lane = $1 AND seq = $3 AND state = 'pending' AND EXISTS (SELECT FROM lane_held)
    RETURNING lane
), advanced AS (
    UPDATE ordering_keys SET pending = pending - 1, updated_at = now()
    WHERE lane IN (SELECT lane FROM finished)
)
SELECT EXISTS (SELECT FROM lane_held) AS held

-- name: retry_in_place
-- Attempt $4 of row $3 of lane $1 failed: the row's next attempt is
-- recorded in its place (attempt + 1, the error $5 appended) — once — and
-- the lane waits $6 seconds (`ready_at`, by Postgres's clock) and is
-- released. Only while $2 is the lane's token, as `dead`: a holder that lost
-- its lane moves no row, delays nothing (docs/design.md, "Ordering keys").
-- Returns whether the row moved; no row: $2 is not the lane's token (a
-- row not moved under our token: this statement sent again after a commit
-- whose answer was lost — only the token's holder moves its rows).
WITH lane_row AS (
    SELECT lane FROM ordering_keys WHERE lane = $1 AND token = $2 FOR UPDATE
), moved AS (
    UPDATE ordered_events SET attempt = attempt + 1, errors = errors || jsonb_build_array($5::jsonb)
    WHERE lane IN (SELECT lane FROM lane_row) AND seq = $3 AND attempt = $4 AND state = 'pending'
    RETURNING lane
)
UPDATE ordering_keys
SET ready_at = greatest(ready_at, clock_timestamp() + $6 * interval '1 second'), updated_at = now(),
    holder = NULL, lease_until = NULL
WHERE lane IN (SELECT lane FROM lane_row)
RETURNING EXISTS (SELECT FROM moved) AS moved

-- name: dead
-- Row $3 of lane $1 (attempt $4) is dead letter $5 ($7: its errors): kept,
-- `dead`, no longer pending; with $6 (on_dead_letter = "block") the lane is
-- blocked by it and released; else the lane goes on. Only while $2 is the
-- lane's token, as the completion's advance: a holder that lost its lane
-- marks nothing, its dead letter is rolled back (docs/design.md, "Ordering
-- keys"). In the dead letter's transaction. Returns whether the row is dead
-- letter $5's (marked now, or by this statement sent again after a commit
-- whose answer was lost); no row: $2 is not the lane's token.
WITH lane_row AS (
    SELECT lane FROM ordering_keys WHERE lane = $1 AND token = $2 FOR UPDATE
), marked AS (
    UPDATE ordered_events SET state = 'dead', dead_letter_id = $5, errors = $7::jsonb
    WHERE lane IN (SELECT lane FROM lane_row) AND seq = $3 AND attempt = $4 AND state = 'pending'
    RETURNING lane
)
UPDATE ordering_keys
SET pending = pending - (SELECT count(*) FROM marked), updated_at = now(),
    blocked_by = CASE WHEN $6 AND EXISTS (SELECT FROM marked) THEN $5 ELSE blocked_by END,
    blocked_since = CASE WHEN $6 AND EXISTS (SELECT FROM marked) THEN now() ELSE blocked_since END,
    holder = CASE WHEN $6 AND EXISTS (SELECT FROM marked) THEN NULL ELSE holder END,
    lease_until = CASE WHEN $6 AND EXISTS (SELECT FROM marked) THEN NULL ELSE lease_until END
WHERE lane IN (SELECT lane FROM lane_row)
RETURNING EXISTS (SELECT FROM marked)
    OR EXISTS (SELECT FROM ordered_events WHERE lane = $1 AND seq = $3 AND state = 'dead' AND dead_letter_id = $5)
    AS marked

-- name: release_if_idle
-- Lane $1 let go by the holder of token $2 when nothing is pending, read on
-- the locked row: an insert committed first keeps it held (the holder goes
-- on), one committed after finds it idle and wakes it. Returns whether $2 is
-- still the lane's token and whether it was released.
WITH lane_row AS (
    SELECT lane, pending, token = $2 AND lease_until IS NOT NULL AS ours
    FROM ordering_keys WHERE lane = $1 FOR UPDATE
), released AS (
    UPDATE ordering_keys SET holder = NULL, lease_until = NULL, updated_at = now()
    FROM lane_row WHERE ordering_keys.lane = lane_row.lane AND lane_row.ours AND lane_row.pending = 0
    RETURNING ordering_keys.lane
)
SELECT lane_row.ours, EXISTS (SELECT FROM released) AS released FROM lane_row

-- name: release
-- Lane $1 let go by the holder of token $2, whatever is pending (a stop, a
-- pause, a hold not yet due, a deferral); `ready_at` moved to $3 seconds from
-- now when given (never earlier than it was). Returns whether it was ours.
UPDATE ordering_keys
SET holder = NULL, lease_until = NULL, updated_at = now(),
    ready_at = CASE WHEN $3::float8 IS NULL THEN ready_at
                    ELSE greatest(ready_at, clock_timestamp() + $3::float8 * interval '1 second') END
WHERE lane = $1 AND token = $2
RETURNING lane

-- name: runnable
-- The watchdog's look (each second, per worker): lanes of the sources $1
-- (known here, not paused) with rows pending, not blocked, whose lease is
-- free or runs out — and whose `ready_at` comes — within the next $3
-- seconds; at most $2, those waiting longest first. A route's lanes only
-- when `SOURCE#ROUTE` is in $4 (the routes in the worker's file): those of
-- a route removed from it, never taken here, cannot fill the `LIMIT`. With
-- each, how long until it may be taken, by Postgres's clock (the worker arms
-- a timer, no clock of its own). Index ordering_keys_runnable.
SELECT lane,
    greatest(extract(epoch FROM greatest(lease_until, ready_at) - clock_timestamp()), 0)::float8 AS wait
FROM ordering_keys
WHERE pending > 0 AND blocked_by IS NULL AND source = ANY($1::text[])
  AND (route IS NULL OR source || '#' || route = ANY($4::text[]))
  AND (ready_at IS NULL OR ready_at < clock_timestamp() + $3 * interval '1 second')
  AND (lease_until IS NULL OR lease_until < clock_timestamp() + $3 * interval '1 second')
ORDER BY ready_at NULLS FIRST, updated_at
LIMIT $2

-- name: take_lanes
-- take_lane for many lanes at once ($1, distinct; holder $2, $3 ms): the
-- lanes coalesced from many holders' takes (workers/ordering/coalesced.py).
-- Each granted as take_lane would, rows locked in lane order, each lane's
-- head counting a delivery when its previous lease ran out. Returns the
-- lanes granted, with their tokens.
WITH old AS (
    SELECT ordering_keys.lane, holder, lease_until FROM ordering_keys
    WHERE ordering_keys.lane = ANY($1::text[])
    ORDER BY ordering_keys.lane FOR UPDATE OF ordering_keys
), taken AS (
    UPDATE ordering_keys
    SET token = nextval('fencing_tokens'), holder = $2,
        lease_until = clock_timestamp() + $3 * interval '1 millisecond', ready_at = NULL, updated_at = now()
    FROM old
    WHERE ordering_keys.lane = old.lane AND ordering_keys.lane = ANY($1::text[])  -- by the key, not every lane
      AND pending > 0 AND blocked_by IS NULL
      AND (ordering_keys.lease_until IS NULL OR ordering_keys.lease_until < clock_timestamp())
      AND (ready_at IS NULL OR ready_at <= clock_timestamp())
    RETURNING ordering_keys.lane, ordering_keys.token,
        old.holder IS NOT NULL AND old.lease_until IS NOT NULL AS expired
), heads AS (  -- each expired lane's head found by its index (ordered_events_next), then by its key
    UPDATE ordered_events SET deliveries = deliveries + 1
    FROM (SELECT head.lane, head.seq FROM taken CROSS JOIN LATERAL (
              SELECT lane, seq FROM ordered_events WHERE lane = taken.lane AND state = 'pending'
              ORDER BY by_value NULLS LAST, seq LIMIT 1) AS head
          WHERE taken.expired) AS expired_head
    WHERE ordered_events.lane = expired_head.lane AND ordered_events.seq = expired_head.seq
)
SELECT lane, token, expired FROM taken

-- name: pages
-- page for many lanes at once ($1 lanes, distinct; $2 their tokens; $3
-- their holds in seconds; $4 rows at most each): one row per pending row
-- of each lane (a lane with none: one row, seq NULL), in lane then run
-- order. A lane missing: no row. (`= ANY`: the lanes by the primary key,
-- not a scan of every lane joined to the list.)
WITH asked AS (
    SELECT * FROM unnest($1::text[], $2::bigint[], $3::float8[]) AS asked(lane, token, hold)
)
SELECT asked.lane, ordering_keys.token = asked.token AND ordering_keys.lease_until IS NOT NULL AS ours,
    ordering_keys.last_by, due.due_in, rows.*
FROM asked JOIN ordering_keys ON ordering_keys.lane = asked.lane AND ordering_keys.lane = ANY($1::text[])
CROSS JOIN LATERAL (
    SELECT extract(epoch FROM min(accepted_at) + asked.hold * interval '1 second' - clock_timestamp())::float8
        AS due_in
    FROM ordered_events WHERE asked.hold > 0 AND ordered_events.lane = asked.lane AND state = 'pending'
) AS due
LEFT JOIN LATERAL (
    SELECT seq, by_value, body, amqp_headers, attempt, replay_of, errors, deliveries
    FROM ordered_events WHERE ordered_events.lane = asked.lane AND state = 'pending'
    ORDER BY by_value NULLS LAST, seq
    LIMIT $4
) AS rows ON true
ORDER BY asked.lane, rows.by_value NULLS LAST, rows.seq

-- name: release_lanes_if_idle
-- release_if_idle for many lanes at once ($1 lanes, distinct; $2 their
-- tokens), rows locked in lane order: each let go when nothing is pending,
-- read on its locked row. Returns each lane found, whether its token is
-- still ours and whether it was released.
WITH asked AS (
    SELECT * FROM unnest($1::text[], $2::bigint[]) AS asked(lane, token)
), lane_rows AS (
    SELECT ordering_keys.lane, ordering_keys.pending,
        ordering_keys.token = asked.token AND ordering_keys.lease_until IS NOT NULL AS ours
    FROM ordering_keys JOIN asked ON ordering_keys.lane = asked.lane AND ordering_keys.lane = ANY($1::text[])
    ORDER BY ordering_keys.lane FOR UPDATE OF ordering_keys
), released AS (
    UPDATE ordering_keys SET holder = NULL, lease_until = NULL, updated_at = now()
    FROM lane_rows WHERE ordering_keys.lane = lane_rows.lane AND lane_rows.ours AND lane_rows.pending = 0
    RETURNING ordering_keys.lane
)
SELECT lane_rows.lane, lane_rows.ours, lane_rows.lane IN (SELECT lane FROM released) AS released FROM lane_rows

-- Ordering keys' statements that several sides run (shared/ordering/store.py):
-- the insert (the ingress, replays by selection), a dead letter's replay in
-- place and discard, and the reads (console, admin, CLI, gauges). The
-- holder's statements (take, pages, release, completion's advance) are the
-- workers'. Every statement that locks several `ordering_keys` rows locks
-- them in lane order, as take_leases does key_fences' (docs/design.md,
-- "Exclusion"): two batches over overlapping lanes never wait for each other
-- in a circle; a lane's row before its pending rows. A dead row is touched
-- only by its dead letter's replay or discard, which lock it before its lane.
-- `pending` counts a lane's rows in state 'pending': a dead row is not
-- pending (blocked or skipped), a replay in place makes it pending again.

-- name: insert_ordered
-- The rows $1..$9 (one array a column, a batch's rows of one lane in
-- arrival order) appended to their lanes: each lane's counter is upserted
-- in lane order and its rows take the next seqs, so per lane seq order is
-- commit order (the counter's row lock holds the next committer until this
-- one ends; a rollback takes its seqs with it). Returns each row's lane and
-- seq in the order given, and on a lane's first row whether the lane went
-- idle -> busy (nothing pending, no live holder, not blocked): it needs a wake-up.
WITH batch AS (
    SELECT *
    FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::numeric[], $7::bytea[],
                $8::bytea[], $9::bigint[])
        WITH ORDINALITY AS batch(lane, source, route, key, arrival, by_value, body, amqp_headers, replay_of, n)
),
lanes AS (
    SELECT lane, min(source) AS source, min(route) AS route, count(*) AS rows, min(n) AS first_n
    FROM batch GROUP BY lane
),
counted AS (
    INSERT INTO ordering_keys AS lane_row (lane, source, route, next_seq, pending)
    SELECT lane, source, NULLIF(route, ''), rows, rows FROM lanes ORDER BY lane
    ON CONFLICT (lane) DO UPDATE
        SET next_seq = lane_row.next_seq + EXCLUDED.next_seq,
            pending = lane_row.pending + EXCLUDED.pending,
            updated_at = now()
    RETURNING lane_row.lane, lane_row.next_seq, lane_row.pending,
        lane_row.blocked_by IS NULL
        AND (lane_row.holder IS NULL OR lane_row.lease_until IS NULL OR lane_row.lease_until < clock_timestamp())
        AS free
),
numbered AS (
    SELECT batch.*, counted.next_seq - lanes.rows + row_number() OVER (PARTITION BY batch.lane ORDER BY batch.n) AS seq,
        batch.n = lanes.first_n AND counted.free AND counted.pending = lanes.rows AS woke
    FROM batch JOIN lanes USING (lane) JOIN counted USING (lane)
),
inserted AS (
    INSERT INTO ordered_events (lane, seq, key, source, route, arrival, by_value, body, amqp_headers, replay_of)
    SELECT lane, seq, key, source, NULLIF(route, ''), arrival, by_value, body, amqp_headers, replay_of
    FROM numbered ORDER BY lane, seq
)
SELECT lane, seq, woke FROM numbered ORDER BY n

-- name: replay_in_place
-- A dead letter's ordered row ($1: its dead_letter_id) runs again in its
-- place, in the replay's transaction ($2: the replay's id): pending again,
-- attempt 1, its errors and deliveries cleared, keeping its seq and `by`,
-- so it runs before every row still waiting; the block it set is cleared
-- (the lane's row made again if pruned meanwhile). The dead row is locked
-- before its lane: a dead row is touched by nothing but a replay or a
-- discard of its dead letter, and of two replays at once one finds it dead.
-- Returns the lane to wake; no row: the dead letter is not an ordered row.
WITH replayed AS (
    UPDATE ordered_events
    SET state = 'pending', attempt = 1, replay_of = $2, errors = '[]', deliveries = 0, dead_letter_id = NULL
    WHERE dead_letter_id = $1 AND state = 'dead'
    RETURNING lane, source, route
)
INSERT INTO ordering_keys AS lane_row (lane, source, route, pending)
SELECT lane, source, route, 1 FROM replayed
ON CONFLICT (lane) DO UPDATE
    SET pending = lane_row.pending + 1,
        blocked_by = CASE WHEN lane_row.blocked_by = $1 THEN NULL ELSE lane_row.blocked_by END,
        blocked_since = CASE WHEN lane_row.blocked_by = $1 THEN NULL ELSE lane_row.blocked_since END,
        ready_at = CASE WHEN lane_row.blocked_by = $1 THEN NULL ELSE lane_row.ready_at END,
        updated_at = now()
RETURNING lane

-- name: discard_ordered
-- Dead letters $1 discarded: their dead ordered rows deleted first (as in
-- replay_in_place), then the lanes they blocked freed, locked in lane order.
-- Returns the lanes freed.
WITH deleted AS (
    DELETE FROM ordered_events WHERE dead_letter_id = ANY($1::bigint[]) AND state = 'dead' RETURNING lane
),
blocked AS (
    SELECT lane FROM ordering_keys
    WHERE blocked_by = ANY($1::bigint[])
        AND (SELECT count(*) FROM deleted) >= 0  -- the delete runs first
    ORDER BY lane FOR UPDATE
)
UPDATE ordering_keys SET blocked_by = NULL, blocked_since = NULL, ready_at = NULL, updated_at = now()
FROM blocked WHERE ordering_keys.lane = blocked.lane
RETURNING ordering_keys.lane

-- name: blocked_lanes
-- Lanes a dead letter blocks, oldest block first; $1: one source (NULL: all), $2: at most.
SELECT lane, source, route, blocked_since, extract(epoch FROM now() - blocked_since)::float8 AS age_seconds,
    blocked_by AS dead_letter_id, pending AS waiting
FROM ordering_keys
WHERE blocked_by IS NOT NULL AND ($1::text IS NULL OR source = $1)
ORDER BY blocked_since, lane
LIMIT $2

-- name: lane_state
-- One lane's row ($1), NULL values where unset.
SELECT lane, source, route, next_seq, pending, token, holder, lease_until, lease_until > now() AS held, ready_at,
    last_by, blocked_by, blocked_since
FROM ordering_keys WHERE lane = $1

-- name: lane_rows
-- A lane's ($1) rows in the order its holder runs the pending ones (by, then
-- seq), dead ones in their place; at most $2.
SELECT seq, key, arrival, by_value, accepted_at, attempt, replay_of, deliveries, state, dead_letter_id
FROM ordered_events WHERE lane = $1
ORDER BY by_value NULLS LAST, seq
LIMIT $2

-- name: waiting_by_source
-- Per source: rows pending and the oldest one's age, lanes blocked and the
-- oldest block's age (the gauges; `sources list`).
WITH waiting AS (
    SELECT source, count(*) AS waiting, extract(epoch FROM now() - min(accepted_at))::float8 AS oldest_seconds
    FROM ordered_events WHERE state = 'pending' GROUP BY source
),
blocked AS (
    SELECT source, count(*) AS blocked, extract(epoch FROM now() - min(blocked_since))::float8 AS oldest_seconds
    FROM ordering_keys WHERE blocked_by IS NOT NULL GROUP BY source
)
SELECT source, coalesce(waiting.waiting, 0) AS waiting, coalesce(waiting.oldest_seconds, 0) AS oldest_seconds,
    coalesce(blocked.blocked, 0) AS blocked, coalesce(blocked.oldest_seconds, 0) AS blocked_oldest_seconds
FROM waiting FULL JOIN blocked USING (source)
ORDER BY source

-- name: waiting_lanes
-- Per source and route ('': the source's own lanes): how many lanes have
-- rows waiting. The ingress counts those of a source or route its sources
-- file lacks: no worker takes them (webhook_ordering_unknown_lanes).
SELECT source, coalesce(route, '') AS route, count(*) AS lanes
FROM ordering_keys WHERE pending > 0
GROUP BY source, route

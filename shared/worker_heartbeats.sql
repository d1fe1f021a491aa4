-- Named SQL of shared/worker_heartbeats.py (loaded by shared.db.queries.load_queries).

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

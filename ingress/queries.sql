-- Named SQL blocks of the ingress (loaded by webhook_ingest.shared.db.queries).

-- name: store_in_outbox
-- One committed insert of a batch, a column per array (shared/db/group_commit.py):
-- each event of the batch is accepted once this returns.
INSERT INTO outbox (key, source, event_id, payload_sha256, body, amqp_headers)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bytea[], $6::bytea[])

-- name: outbox_writable
-- Cheap readiness check: the table exists, we may insert, and this server
-- is not a read-only standby (an HA failover in progress).
SELECT has_table_privilege('outbox', 'INSERT') AND NOT pg_is_in_recovery()

-- name: claim_outbox_batch
-- The oldest rows no other relay holds, past those this relay cannot read
-- ($2): the row locks last until the transaction ends, which is after the
-- batch's publishes and deletes.
SELECT id, body, amqp_headers FROM outbox WHERE id <> ALL($2::bigint[])
ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED

-- name: outbox_rows_left
-- Which of these rows are still there (an operator deletes an unreadable one).
SELECT coalesce(array_agg(id), '{}') FROM outbox WHERE id = ANY($1::bigint[])

-- name: delete_outbox_rows
DELETE FROM outbox WHERE id = ANY($1::bigint[])

-- name: outbox_backlog
SELECT count(*) AS pending,
       coalesce(extract(epoch FROM clock_timestamp() - min(stored_at)), 0)::float8 AS oldest_age_seconds
FROM outbox

-- The console's sessions (ingress/console/sessions.py).

-- name: create_console_session_key
-- The first process to need the key makes it; the others' inserts do nothing.
INSERT INTO console_session_key (key) VALUES ($1) ON CONFLICT DO NOTHING

-- name: console_session_key
SELECT key FROM console_session_key

-- name: begin_console_session
INSERT INTO console_sessions (id_sha256, role, token_fingerprint, client, expires_at)
VALUES ($1, $2, $3, $4, now() + make_interval(secs => $5))

-- name: live_console_session
SELECT role, token_fingerprint FROM console_sessions
WHERE id_sha256 = $1 AND ended_at IS NULL AND expires_at > now()

-- name: end_console_session
UPDATE console_sessions SET ended_at = now() WHERE id_sha256 = $1 AND ended_at IS NULL

-- name: forget_old_console_sessions
-- A day after they expired: kept until then for whoever reads the table after an incident.
DELETE FROM console_sessions WHERE expires_at < now() - interval '1 day'

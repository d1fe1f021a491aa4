-- Named SQL of shared/incidents/ (loaded by shared.db.queries.load_queries).

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
-- A change waits while an earlier one of its incident is claimed or waits
-- out a retry: a receiver gets an incident's changes in order.
UPDATE incident_changes c
SET claimed_until = clock_timestamp() + make_interval(secs => $2), attempts = c.attempts + 1
FROM (SELECT id FROM incident_changes n
      WHERE notified_at IS NULL AND state <> 'acknowledged' AND claimed_until < clock_timestamp()
        AND NOT EXISTS (SELECT FROM incident_changes p
                        WHERE p.incident_id = n.incident_id AND p.id < n.id AND p.notified_at IS NULL
                          AND p.state <> 'acknowledged' AND p.claimed_until >= clock_timestamp())
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

-- name: incident_lock_timeout
-- For the rest of the transaction (a savepoint's rollback undoes it): an
-- incident's row held elsewhere — a partitioned worker's transaction, ~25 s
-- until keepalives end it — costs a failure's count, never the dead letter's
-- commit nor a statement connection for long (adversary round 6, R6-5).
SELECT set_config('lock_timeout', $1, true)

-- Incidents: failures grouped by source, handler and error fingerprint
-- (shared/incidents/model.py; docs/oncall.md, "Incidents").

-- One row per (source, handler, fingerprint), for ever: a new failure after
-- it was resolved reopens it (`opened_at` is when this episode began).
CREATE TABLE incidents (
    id               bigserial PRIMARY KEY,
    source           text NOT NULL,
    handler          text NOT NULL,
    fingerprint      text NOT NULL,
    error_type       text NOT NULL,
    error_pattern    text NOT NULL,
    last_error       text NOT NULL,
    state            text NOT NULL DEFAULT 'open' CHECK (state IN ('open', 'acknowledged', 'resolved')),
    first_seen       timestamptz NOT NULL DEFAULT now(),
    last_seen        timestamptz NOT NULL DEFAULT now(),
    opened_at        timestamptz NOT NULL DEFAULT now(),
    failures         bigint NOT NULL DEFAULT 1,
    dead_letters     bigint NOT NULL DEFAULT 0,
    acknowledged_by  text,
    acknowledged_at  timestamptz,
    resolved_by      text,
    resolved_at      timestamptz,
    UNIQUE (source, handler, fingerprint)
);
CREATE INDEX incidents_unresolved ON incidents (last_seen) WHERE state <> 'resolved';

-- The events an incident holds: one row per key, its failures counted.
CREATE TABLE incident_events (
    incident_id      bigint NOT NULL REFERENCES incidents (id),
    key              text NOT NULL,
    event_id         text NOT NULL,
    failures         integer NOT NULL DEFAULT 1,
    last_attempt     integer NOT NULL,
    dead_letter_id   bigint,
    first_failed_at  timestamptz NOT NULL DEFAULT now(),
    last_failed_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (incident_id, key)
);
CREATE INDEX incident_events_dead_letter_id ON incident_events (dead_letter_id) WHERE dead_letter_id IS NOT NULL;

-- Each state change, in the transaction that made it: the incident's
-- history, and what notifications are sent from (workers/failures/notifications.py):
-- a worker claims a change for a while (`claimed_until`), sends it to each
-- target not yet in `notified_targets`, and records each as it succeeds;
-- `notified_at` once all have. Acknowledgements are not notified.
CREATE TABLE incident_changes (
    id                bigserial PRIMARY KEY,
    incident_id       bigint NOT NULL REFERENCES incidents (id),
    state             text NOT NULL,
    actor             text NOT NULL,
    at                timestamptz NOT NULL DEFAULT clock_timestamp(),
    notified_at       timestamptz,
    notified_targets  text[] NOT NULL DEFAULT '{}',
    attempts          integer NOT NULL DEFAULT 0,
    claimed_until     timestamptz NOT NULL DEFAULT '-infinity',
    last_error        text
);
CREATE INDEX incident_changes_to_notify ON incident_changes (id) WHERE notified_at IS NULL AND state <> 'acknowledged';

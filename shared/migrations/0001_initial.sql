-- The tables docs/reference.md §9 names, and the internal ones the workers need.

CREATE TABLE processed_events (
    key             text PRIMARY KEY,
    source          text NOT NULL,
    event_id        text NOT NULL,
    payload_sha256  text NOT NULL,
    fencing_token   bigint,
    attempts        integer NOT NULL,
    completed_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX processed_events_completed_at ON processed_events (completed_at);

CREATE TABLE inbox (
    key          text PRIMARY KEY,
    source       text NOT NULL,
    event_id     text NOT NULL,
    payload      jsonb NOT NULL,
    received_at  timestamptz NOT NULL
);

CREATE TABLE dead_letters (
    id              bigserial PRIMARY KEY,
    key             text NOT NULL,
    source          text NOT NULL,
    event_id        text NOT NULL,
    payload_sha256  text NOT NULL,
    body            bytea NOT NULL,          -- as received: what a replay publishes
    payload         jsonb,                   -- the parsed body, for reading
    headers         jsonb NOT NULL DEFAULT '{}',
    received_at     timestamptz NOT NULL,
    attempts        integer NOT NULL,
    errors          jsonb NOT NULL DEFAULT '[]',
    status          text NOT NULL DEFAULT 'dead' CHECK (status IN ('dead', 'replayed', 'discarded')),
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX dead_letters_status_id ON dead_letters (status, id DESC);
CREATE INDEX dead_letters_source_id ON dead_letters (source, id DESC);

-- Fencing tokens: a sequence only grows, whatever Redis forgets.
CREATE SEQUENCE fencing_tokens;
CREATE TABLE key_fences (
    key         text PRIMARY KEY,
    token       bigint NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- Same key, different payload: recorded for operators, never run again.
CREATE TABLE event_conflicts (
    id                  bigserial PRIMARY KEY,
    key                 text NOT NULL,
    source              text NOT NULL,
    event_id            text NOT NULL,
    completed_sha256    text NOT NULL,
    conflicting_sha256  text NOT NULL,
    seen_at             timestamptz NOT NULL DEFAULT now()
);

-- The on-call console (docs/reference.md §8.1): who did what to which dead letters, every
-- replay a dead letter went through, and the console's bulk actions.

-- Every replay and discard, from the console, the admin API or the CLI.
-- `role`: operator | viewer (a token of the console or the admin API) or cli;
-- `name`: the OS user for the CLI; `via`: console | admin-api | cli.
CREATE TABLE audit_log (
    id               bigserial PRIMARY KEY,
    at               timestamptz NOT NULL DEFAULT clock_timestamp(),
    role             text NOT NULL,
    name             text,
    via              text NOT NULL,
    action           text NOT NULL,
    dead_letter_ids  bigint[] NOT NULL DEFAULT '{}',
    detail           jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX audit_log_dead_letter_ids ON audit_log USING gin (dead_letter_ids);

-- A replay adds a row here; the dead letter keeps its errors and its first
-- status change is still readable from its history.
CREATE TABLE dead_letter_replays (
    id              bigserial PRIMARY KEY,
    dead_letter_id  bigint NOT NULL REFERENCES dead_letters (id),
    replayed_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    actor           text NOT NULL,
    bulk_action_id  bigint
);
CREATE INDEX dead_letter_replays_dead_letter_id ON dead_letter_replays (dead_letter_id, id);

-- "Replay all matching" / "Discard all matching": the set of ids frozen when
-- the operator asked, acted on at `rate` per second by one ingress process.
CREATE TABLE console_bulk_actions (
    id               bigserial PRIMARY KEY,
    action           text NOT NULL CHECK (action IN ('replay', 'discard')),
    dead_letter_ids  bigint[] NOT NULL,
    filter           jsonb NOT NULL DEFAULT '{}',
    state            text NOT NULL DEFAULT 'prepared'
                     CHECK (state IN ('prepared', 'running', 'done', 'failed', 'cancelled')),
    rate             double precision,
    done             bigint[] NOT NULL DEFAULT '{}',
    skipped          bigint[] NOT NULL DEFAULT '{}',
    error            text,
    created_by       text NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    finished_at      timestamptz
);

CREATE INDEX dead_letters_created_at ON dead_letters (created_at);

-- Replays of archived events by filter and window (docs/reference.md §8,
-- "Replaying archived events"; docs/design.md, "A replay by selection").
--
-- `event_replays` is one replay: the filter it was asked with, how many
-- events it froze, and its progress, which any process reads (the console,
-- the admin API, `webhook-ingest events replay --show`). Items are handled
-- in order, so progress is a cursor: every item below `next_item` was
-- published or skipped. Its id names the replay's idempotency keys,
-- `replay-ID/KEY` (shared/replays/keys.py): every replay is a new set of keys.
CREATE TABLE event_replays (
    id           bigserial PRIMARY KEY,
    filter       jsonb NOT NULL DEFAULT '{}',
    total        integer NOT NULL,
    state        text NOT NULL DEFAULT 'prepared'
                 CHECK (state IN ('prepared', 'running', 'done', 'failed', 'cancelled')),
    rate         double precision,
    next_item    integer NOT NULL DEFAULT 1,
    published    integer NOT NULL DEFAULT 0,
    skipped      integer NOT NULL DEFAULT 0,
    error        text,
    created_by   text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    started_at   timestamptz,
    stepped_at   timestamptz,      -- the runner's last step: a run whose process died is resumable after a while
    finished_at  timestamptz
);

-- The selection, frozen when the replay was prepared: the events (one
-- arrival per key, the oldest the filter matched) numbered from 1 in the
-- order they were received. The body is read from the archive when the
-- item is published, so an item whose day the retention dropped meanwhile
-- is skipped, never replayed from a copy kept here.
CREATE TABLE event_replay_items (
    replay_id    bigint NOT NULL REFERENCES event_replays (id),
    item         integer NOT NULL,
    source       text NOT NULL,
    key          text NOT NULL,
    received_at  timestamptz NOT NULL,
    PRIMARY KEY (replay_id, item)
);
-- An event's page lists the replays it was part of.
CREATE INDEX event_replay_items_key ON event_replay_items (key);

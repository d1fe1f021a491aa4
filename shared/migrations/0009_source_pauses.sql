-- Paused sources (docs/reference.md §8.3): a source listed here has its
-- events accepted and parked in NS.paused.SOURCE, not processed, until it is
-- resumed. Who paused it is here; every pause and resume is in audit_log.
CREATE TABLE source_pauses (
    source     text PRIMARY KEY,
    paused_at  timestamptz NOT NULL DEFAULT now(),
    paused_by  text NOT NULL
);

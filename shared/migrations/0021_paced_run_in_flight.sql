-- The item a paced run has in flight (shared/runs/locks.py; docs/design.md,
-- "Paced runs"): its runner commits "item n in flight" here
-- before each publish, then publishes and steps its run's progress in a
-- second transaction. A runner that dies mid-publish loses its step, not
-- this mark: a Cancel then finds item n in flight and not stepped, counts
-- it published and says it is `in_doubt` (it may not have gone out). One
-- row per run, rewritten at each item. A table of its own, so that the
-- previous release, reading its runs' rows whole, runs on this schema.
CREATE TABLE paced_run_in_flight (
    kind       text NOT NULL CHECK (kind IN ('event_replay', 'bulk_action')),
    run_id     bigint NOT NULL,
    item       bigint NOT NULL,  -- a replay's item number; a bulk action's dead letter id
    marked_at  timestamptz NOT NULL DEFAULT now(),
    in_doubt   boolean NOT NULL DEFAULT false,  -- a Cancel counted it published, not stepped
    PRIMARY KEY (kind, run_id)
);

-- Where the archive's upkeep is in its walk over an ended replay's items
-- (shared/upkeep.py; docs/design.md, "Replay items pruned").
-- Each pruning statement reads the replay's next page of items from
-- `next_item`, deletes those whose event left the archive, skips the ones
-- still archived and moves `next_item` past the page, so an archived item
-- never holds back the ones after it. Once past the last item, a new pass
-- from the first item left begins no sooner than a day after this one
-- began (`pass_started_at`): the skipped items are read again at most
-- about once a day, never every minute. One row per ended replay the
-- upkeep has walked. A table of its own, so that the previous release,
-- reading its replays' rows whole into its dataclasses, runs on this schema.
CREATE TABLE event_replay_prune_passes (
    replay_id        bigint PRIMARY KEY REFERENCES event_replays (id),
    next_item        integer NOT NULL,                   -- the pass reads items from here
    pass_started_at  timestamptz NOT NULL DEFAULT now()  -- when this pass began at the first item left
);

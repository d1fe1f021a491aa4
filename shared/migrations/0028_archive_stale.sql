-- The event archive's `stale` arrivals (docs/design.md, "Ordering keys"):
-- an ordered source's event with `stale = "skip"` whose `by` fell behind
-- its lane's last processed one is completed without its handler
-- (`processed_events.stale`, migration 0027). Its arrival's end is `stale`:
-- an end as `processed` is (the same step), written by the worker's note
-- or, the note lost with its worker, by the settling sweep from the
-- completion's `stale`.
ALTER TABLE event_archive DROP CONSTRAINT event_archive_status_check;
ALTER TABLE event_archive ADD CONSTRAINT event_archive_status_check
    CHECK (status IN ('queued', 'retrying', 'processed', 'dead', 'discarded', 'conflict', 'duplicate', 'ignored',
                      'stale'));

-- The same steps as migration 0008's, `stale` named beside `processed`.
CREATE OR REPLACE FUNCTION event_archive_step(status text) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE status WHEN 'queued' THEN 0 WHEN 'retrying' THEN 1 WHEN 'processed' THEN 2 WHEN 'stale' THEN 2
                   WHEN 'discarded' THEN 3 ELSE 2 END;

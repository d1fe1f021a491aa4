-- The event archive's `ignored` arrivals (docs/reference.md §3, `ignore`):
-- verified events a source's ignore rule matched, answered 200 and never
-- queued. Their row is written by the ingress alone, with the rule that
-- matched (`type=ping`, as the answer and the metric name it).
ALTER TABLE event_archive ADD COLUMN ignore_rule text;
ALTER TABLE event_archive DROP CONSTRAINT event_archive_status_check;
ALTER TABLE event_archive ADD CONSTRAINT event_archive_status_check
    CHECK (status IN ('queued', 'retrying', 'processed', 'dead', 'discarded', 'conflict', 'duplicate', 'ignored'));

-- The archive's settling sweep (shared/archive/settling.py, run by every
-- process's upkeep): rows still `queued` or `retrying`, oldest first. Only
-- those rows have an entry, so the index stays as small as the pipeline's
-- backlog, and a sweep reads no settled row.
CREATE INDEX event_archive_unsettled ON event_archive (received_at) WHERE status IN ('queued', 'retrying');

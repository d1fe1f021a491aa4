-- The settling sweep's page starts after the last page's row, named whole
-- (received_at, source, key, arrival: the primary key's columns, the time
-- first): after its receive time alone, rows of that same millisecond past
-- the page's end were skipped, and a burst stamped with one millisecond
-- could hide a lost outcome from every round (docs/design.md, "The
-- settling sweep"). 0018's index of the unsettled rows is made again on that
-- whole name, so the page is still read from it, in order, a page first;
-- it keeps serving searches by status (its first column is unchanged).
--
-- Built before the old one is dropped: the build holds the archive's
-- writes (a SHARE lock on each day's table) but not its reads; the drop's
-- exclusive lock is held only from the drop to this migration's commit.
CREATE INDEX event_archive_unsettled_by_name ON event_archive (received_at, source, key, arrival)
    WHERE status IN ('queued', 'retrying');
DROP INDEX event_archive_unsettled;
ALTER INDEX event_archive_unsettled_by_name RENAME TO event_archive_unsettled;

-- The searches that read the whole archive for a few rows (docs/reference.md
-- §8, "Events"; docs/performance.md, "Searching a million archived events"):
-- an event type, a status, a key or an event id prefix. A page merged every
-- day of every source newest first by received_at, and a day without a
-- match was read to its end before the first row came out; a count read
-- every row. Their price, another entry per arrival in each day's table
-- (none for the status of a row that goes from queued to processed), is
-- measured in performance.md.

-- An event type, newest first: each day's matches in order, nothing read
-- in a day that has none.
CREATE INDEX event_archive_type ON event_archive (event_type, received_at);

-- A status other than those of most rows, newest first: not `processed`
-- (found at once by received_at), nor `queued` and `retrying`, whose rows
-- event_archive_unsettled (0018) holds. The rest (dead, discarded,
-- duplicate, conflict, ignored) are few, and a row that goes from queued
-- to processed never has an entry here. Its predicate names `status`, so
-- an outcome's update is never HOT: as with 0018's already.
CREATE INDEX event_archive_status ON event_archive (status, received_at)
WHERE status NOT IN ('processed', 'queued', 'retrying');

-- Key and event id prefixes. starts_with() can use a btree index only in
-- the "C" collation (byte order: a prefix's matches are one range, which
-- Postgres 15 derives from the prefix), whatever the column's collation.
CREATE INDEX event_archive_key_prefix ON event_archive (key COLLATE "C");
CREATE INDEX event_archive_event_id_prefix ON event_archive (event_id COLLATE "C");

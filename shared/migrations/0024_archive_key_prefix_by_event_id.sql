-- A key is SOURCE:EVENT_ID (shared/event/ids.py, idempotency_key), so a key
-- prefix that names its source ("stripe:evt_1") is that source's event id
-- prefix ("evt_1"), which 0019's event id index serves within the source's
-- tables; one without a ':' names no event id and matches whole sources,
-- which no index of keys narrowed. 0019's index of the key alone was
-- entered by every arrival and again by every outcome's update (never HOT:
-- docs/performance.md, "The floor"), for searches another index serves.
DROP INDEX event_archive_key_prefix;

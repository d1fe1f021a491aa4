-- Payload containment over the whole archive (docs/reference.md §8,
-- "Events"; docs/performance.md, "Searching a million archived events"):
-- without an index a search for {"customer": "cus_123"} parses every body
-- of its range, seconds over a million rows. jsonb_path_ops: it serves only
-- `@>`, the one operator the search uses, and is smaller than jsonb_ops.
-- A body that is not a JSON document (event_archive_payload is NULL) has
-- no entry.
CREATE INDEX event_archive_payload_gin ON event_archive USING gin (event_archive_payload(body) jsonb_path_ops);

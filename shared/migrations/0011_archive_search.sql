-- Searching the event archive (docs/reference.md §8, "Events"; the admin API's
-- GET /admin/events and `webhook-ingest events`).

-- Newest first across every source's days: each day's index is read in
-- order and merged, so a page stops after its rows instead of sorting the
-- whole archive. One more index entry per arrival.
CREATE INDEX event_archive_received_at ON event_archive (received_at);

-- An event's dead letters, by its key (an event's page links them).
CREATE INDEX dead_letters_key ON dead_letters (key);

-- The body as jsonb for a payload search (`@>`), NULL when it is not a JSON
-- object Postgres can hold (a form, bytes that are not UTF-8): a search
-- must not fail on one such row.
CREATE FUNCTION event_archive_payload(body bytea) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RETURN convert_from(body, 'UTF8')::jsonb;
EXCEPTION WHEN OTHERS THEN
    RETURN NULL;
END
$$;

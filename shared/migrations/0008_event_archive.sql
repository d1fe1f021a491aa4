-- The event archive (docs/reference.md §9; docs/design.md, "The archive"): every
-- accepted arrival of an event, whatever became of it, for each source's
-- `retention`.
--
-- One row per arrival: the ingress writes what arrived (a copy of an event
-- is an arrival of its own, status `duplicate` once settled so), the workers
-- what became of it. Either may come first: the workers' write makes a row
-- without `body` when the ingress's has not arrived yet, and the ingress's
-- then fills it in. `processing` is not stored: it is a `queued` row whose
-- key's lease is held.
--
-- Partitioned by source, then each source by day of `received_at` (UTC):
-- tables `event_archive_<source>` and `event_archive_<source>_<YYYYMMDD>`,
-- made ahead and dropped whole by `event_archive_keep` below, which every
-- ingress process and worker runs from time to time. Nothing is ever deleted
-- row by row. The primary key holds both partition keys, as Postgres requires.
CREATE TABLE event_archive (
    source          text NOT NULL,
    key             text NOT NULL,
    received_at     timestamptz NOT NULL,
    event_id        text NOT NULL,
    event_type      text,
    payload_sha256  text NOT NULL,
    body            bytea,            -- as received; NULL until the ingress's write arrives (or if it was lost)
    headers         jsonb,            -- as the handler sees them (signature headers included)
    status          text NOT NULL DEFAULT 'queued'
                    CHECK (status IN ('queued', 'retrying', 'processed', 'dead', 'discarded', 'conflict', 'duplicate')),
    replay_of       bigint NOT NULL DEFAULT 0,   -- the retry chain of the status (dead_letter_replays.id; 0: the ingress's)
    attempts        integer NOT NULL DEFAULT 0,
    last_error      text,
    completed_at    timestamptz,
    PRIMARY KEY (source, key, received_at)
) PARTITION BY LIST (source);

-- A status is written only over an earlier one: a later chain, a later
-- attempt, or at the same attempt a further step. Writes reach the table in
-- batches from several processes, not in the order things happened.
CREATE FUNCTION event_archive_step(status text) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE status WHEN 'queued' THEN 0 WHEN 'retrying' THEN 1 WHEN 'discarded' THEN 3 ELSE 2 END;

-- A source's tables: its own (made if missing, while days are to be made),
-- its days from `make_from` to `make_until` (made if missing), and its days
-- before `keep_from` dropped. Serialised per source by an advisory lock of
-- the two-key kind (the workers' turns use the one-key kind), so processes
-- running it at once do not trip over one another.
CREATE FUNCTION event_archive_keep(source text, source_table text, keep_from date, make_from date, make_until date,
                                   OUT made integer, OUT dropped integer)
LANGUAGE plpgsql AS $$
DECLARE
    day date;
    leaf text;
BEGIN
    made := 0;
    dropped := 0;
    PERFORM pg_advisory_xact_lock(2022, hashtext(source_table));
    IF to_regclass(source_table) IS NULL THEN
        IF make_from > make_until THEN
            RETURN;
        END IF;
        EXECUTE format('CREATE TABLE %I PARTITION OF event_archive FOR VALUES IN (%L) PARTITION BY RANGE (received_at)',
                       source_table, source);
    END IF;
    FOR leaf IN
        SELECT child.relname FROM pg_inherits JOIN pg_class child ON child.oid = pg_inherits.inhrelid
        WHERE pg_inherits.inhparent = to_regclass(source_table)
          AND child.relname = source_table || '_' || right(child.relname, 8) AND right(child.relname, 8) ~ '^[0-9]{8}$'
          AND to_date(right(child.relname, 8), 'YYYYMMDD') < keep_from
    LOOP
        EXECUTE format('DROP TABLE %I', leaf);
        dropped := dropped + 1;
    END LOOP;
    day := make_from;
    WHILE day <= make_until LOOP
        leaf := source_table || '_' || to_char(day, 'YYYYMMDD');
        IF to_regclass(leaf) IS NULL THEN
            EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (%L) TO (%L) WITH (fillfactor = 90)',
                           leaf, source_table, to_char(day, 'YYYY-MM-DD') || ' 00:00+00',
                           to_char(day + 1, 'YYYY-MM-DD') || ' 00:00+00');
            made := made + 1;
        END IF;
        day := day + 1;
    END LOOP;
END
$$;

-- Every accepted copy is an archived arrival of its own (docs/design.md,
-- "The archive"; issue 22, item 1). A row was (source, key, received_at),
-- the receive time in milliseconds, so two copies of one event the ingress
-- stamped with the same millisecond (a provider sending them together)
-- were one row: one 200 lost from the archive. Each arrival now carries its
-- own id, drawn at random by the ingress (`x-arrival` on the message, kept
-- through retries, a route's fan-out, the outbox and a dead letter's
-- replay); 0 for the rows and messages from before it.
--
-- Both partition keys stay in the key, as Postgres requires; the new
-- primary key is built on every existing day's table (one index build each,
-- under the lock ALTER TABLE takes).
ALTER TABLE event_archive ADD COLUMN arrival bigint NOT NULL DEFAULT 0;
ALTER TABLE event_archive DROP CONSTRAINT event_archive_pkey;
ALTER TABLE event_archive ADD PRIMARY KEY (source, key, received_at, arrival);

-- A dead letter names the arrival it ended (its discard marks that row).
ALTER TABLE dead_letters ADD COLUMN arrival bigint NOT NULL DEFAULT 0;

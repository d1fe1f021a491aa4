-- The payload function's exception block (0011) is a subtransaction, which
-- no parallel worker (nor its leader, while they run) may start: a payload
-- search Postgres chose to run in parallel failed ("cannot start
-- subtransactions during a parallel operation"), as a search over a large
-- archive planned for its own filter does. Unsafe, such a search stays in
-- one process.
ALTER FUNCTION event_archive_payload(bytea) PARALLEL UNSAFE;

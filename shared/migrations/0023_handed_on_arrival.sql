-- Which arrival's message a key's last attempt handed on (workers/claim/attempts.py)
-- carried (0017's id; NULL: recorded before this, by the previous release's
-- workers, or of a message without an arrival id). A twin message of that
-- same arrival (the outbox's row beside a publish confirmed late, a
-- redelivery) is acked as a copy of the attempt, and its archive note is
-- then not written: that arrival's end is its own chain's, which the
-- settling sweep reads should its note be lost (docs/design.md, "The
-- archive"). A nullable column: no rewrite of the table.
ALTER TABLE key_fences ADD COLUMN arrival bigint;

-- Which arrival of an event ran it (docs/design.md, "The settling sweep"): the
-- completion records its message's arrival id (0017), so the archive's
-- sweep settles that arrival `processed` and its copies `duplicate`
-- instead of guessing the oldest. NULL: a completion from before, or of a
-- message that carried no arrival.
ALTER TABLE processed_events ADD COLUMN arrival bigint;

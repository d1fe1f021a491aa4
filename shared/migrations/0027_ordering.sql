-- Ordering keys (docs/design.md, "Ordering keys"): an ordered source's accepted event is a row of
-- `ordered_events`, numbered per lane (one ordering key of one source or
-- route, `SOURCE[#ROUTE]:VALUE`) by the ingress's commit that bumps the
-- lane's counter in `ordering_keys`. One worker at a time holds a lane (a
-- lease and fencing token on its row) and runs its rows in
-- (by_value NULLS LAST, seq) order; RabbitMQ carries only wake-ups.
-- Per lane, seq order is commit order: the counter's row lock serialises the
-- committers, and a rollback takes its seqs with it (no gaps).
CREATE TABLE ordering_keys (
    lane           text PRIMARY KEY,
    source         text NOT NULL,
    route          text,
    next_seq       bigint NOT NULL DEFAULT 0,        -- seqs given so far
    pending        integer NOT NULL DEFAULT 0,       -- rows not finished (pending or dead)
    token          bigint NOT NULL DEFAULT 0,        -- the holder's, from fencing_tokens
    lease_until    timestamptz,                      -- held until then
    holder         text,                             -- worker_id
    ready_at       timestamptz,                      -- not before (a retry's delay, a hold)
    last_by        numeric,                          -- the `by` of the last processed row
    blocked_by     bigint UNIQUE,                    -- the dead letter it waits on (on_dead_letter = "block")
    blocked_since  timestamptz,
    updated_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ordering_keys_runnable ON ordering_keys (source, ready_at) WHERE pending > 0 AND blocked_by IS NULL;
CREATE INDEX ordering_keys_blocked ON ordering_keys (source, blocked_since) WHERE blocked_by IS NOT NULL;

CREATE TABLE ordered_events (
    lane            text NOT NULL,
    seq             bigint NOT NULL,
    key             text NOT NULL,                   -- its idempotency key (KEY, KEY#ROUTE, replay-R/KEY)
    source          text NOT NULL,
    route           text,
    arrival         bigint NOT NULL DEFAULT 0,
    by_value        numeric,                         -- ordering.by, read as a number; NULL: none or unreadable
    accepted_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    body            bytea NOT NULL,                  -- as received
    amqp_headers    bytea NOT NULL,                  -- the outbox's encoding of the message's headers
    attempt         integer NOT NULL DEFAULT 1,
    replay_of       bigint NOT NULL DEFAULT 0,
    errors          jsonb NOT NULL DEFAULT '[]',
    deliveries      integer NOT NULL DEFAULT 0,      -- takes that found its holder's lease expired, not released
    dead_letter_id  bigint,
    state           text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'dead')),
    PRIMARY KEY (lane, seq)
);
CREATE INDEX ordered_events_next ON ordered_events (lane, by_value, seq) WHERE state = 'pending';
CREATE INDEX ordered_events_waiting ON ordered_events (source, accepted_at) WHERE state = 'pending';
CREATE INDEX ordered_events_dead_letter ON ordered_events (dead_letter_id) WHERE dead_letter_id IS NOT NULL;

-- An ordered event completed without its handler (ordering.stale = "skip"):
-- the archive's sweep reads it as `stale` (0028).
ALTER TABLE processed_events ADD COLUMN stale boolean NOT NULL DEFAULT false;

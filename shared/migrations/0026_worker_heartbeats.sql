-- Workers report themselves (shared/worker_heartbeats.py; docs/design.md,
-- "Workers report themselves"): each worker process UPSERTs its row every
-- few seconds on its bookkeeping pool, never the claim path's. A row whose
-- `last_seen` is older than three of its own `beat_seconds` is a silent
-- worker (stopped, SIGSTOPped, cut off, or dead without saying so); one
-- that stopped cleanly says `stopped_at`. Rows not seen for a day (an
-- hour once stopped) are deleted by the beats of the workers still alive.
CREATE TABLE worker_heartbeats (
    worker_id     text PRIMARY KEY,              -- name@host:pid
    name          text NOT NULL,
    host          text NOT NULL,
    pid           integer NOT NULL,
    started_at    timestamptz NOT NULL,
    last_seen     timestamptz NOT NULL DEFAULT now(),
    beat_seconds  real NOT NULL,                 -- its heartbeat interval
    stopped_at    timestamptz,                   -- it stopped cleanly
    in_flight     integer NOT NULL,              -- messages delivered to it, not yet settled
    keys_held     integer NOT NULL,              -- keys it is running (each under a lease, or taking one)
    pool_in_use   integer NOT NULL,              -- the claim path's Postgres connections in use
    pool_size     integer NOT NULL,              -- ... and their most
    degraded      boolean NOT NULL               -- Redis quorum lost: Postgres alone
);

-- Each worker's outcomes per minute, added to by its beats: the console's
-- picture of the last hour. Pruned past two hours by the same beats.
CREATE TABLE worker_minutes (
    minute        timestamptz NOT NULL,
    worker_id     text NOT NULL,
    processed     integer NOT NULL DEFAULT 0,
    retried       integer NOT NULL DEFAULT 0,
    dead          integer NOT NULL DEFAULT 0,
    duplicate     integer NOT NULL DEFAULT 0,
    lease_losses  integer NOT NULL DEFAULT 0,   -- handlers cancelled: their lease not confirmed in time
    PRIMARY KEY (minute, worker_id)
);

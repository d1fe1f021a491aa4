-- Named SQL of shared/archive/ (loaded by shared.db.queries.load_queries).

-- the event archive --------------------------------------------------------
-- Written in batches behind the requests' and the workers' backs
-- (shared/archive/writer.py) through shared.archive.store; its tables are
-- made and dropped by event_archive_keep (migration 0008). Each side names
-- a row by (source, key, received_at, arrival), the receive time in integer
-- milliseconds and the arrival's id as the message carries them (0017).

-- name: archive_arrivals
-- What the ingress accepted (status queued), answered as a duplicate, or
-- ignored (with the rule that matched). A row a worker wrote first (its
-- outcome, no body yet) gets the body, headers and type; any other row is
-- left as it is.
INSERT INTO event_archive AS archived (source, key, received_at, arrival, event_id, event_type, payload_sha256, body,
                                       headers, status, ignore_rule)
SELECT source, key, timestamptz 'epoch' + received_ms * interval '1 millisecond', arrival, event_id, event_type,
       payload_sha256, body, headers::jsonb, status, ignore_rule
FROM unnest($1::text[], $2::text[], $3::int8[], $4::int8[], $5::text[], $6::text[], $7::text[], $8::bytea[],
            $9::text[], $10::text[], $11::text[])
     AS arriving(source, key, received_ms, arrival, event_id, event_type, payload_sha256, body, headers, status,
                 ignore_rule)
ON CONFLICT (source, key, received_at, arrival) DO UPDATE
SET body = EXCLUDED.body, headers = EXCLUDED.headers, event_type = EXCLUDED.event_type
WHERE archived.body IS NULL

-- name: archive_outcomes
-- What became of arrivals, from the workers: written over the row's status
-- only when it is a step on (event_archive_step: a later chain, a later
-- attempt, or a further step of the same one), and `duplicate` only over a
-- row still queued (a copy of a retry message is not its event's end), or
-- over a `retrying` row of an earlier attempt: the retry message itself found
-- the event completed (after a prune, maybe only Redis still knew), which
-- ends the chain, and no completion may be left for the sweep.
-- At one chain and attempt the arrival's own end steps over a `duplicate`
-- or a `conflict` written first by a twin message of the arrival (an
-- outbox row beside a publish confirmed late, a second fan-out; a
-- conflict: the twin still found another payload's completion, which a
-- prune then forgot): `dead`, and `processed` when
-- its run's completion ($12: the route, its key KEY#ROUTE) names this
-- arrival and is younger than the sweep's grace ($13 seconds). So never
-- over a `duplicate` a sweep wrote guessing which copy ran: this release's
-- guesses only for a completion that names none, the previous release's
-- (still sweeping during an upgrade) only past the grace. One run, one
-- `processed`. And a twin's `duplicate` of the arrival its run's
-- completion names, or the key's last attempt handed on names (key_fences,
-- migration 0023: the twin found that attempt run), is not written at all:
-- that arrival's end is its own chain's, its worker's note or, the batch
-- lost with a killed worker, the sweep's (which reads the row still queued
-- or retrying, never a `duplicate` one).
-- A row the ingress has not written yet is made without its body.
WITH outcome AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::int8[], $4::int8[], $5::text[], $6::text[], $7::text[],
                         $8::int8[], $9::int4[], $10::text[], $11::int8[], $12::text[])
        AS outcome(source, key, received_ms, arrival, event_id, payload_sha256, status, replay_of, attempts,
                   last_error, at_ms, route)
)
INSERT INTO event_archive AS archived (source, key, received_at, arrival, event_id, payload_sha256, status, replay_of,
                                       attempts, last_error, completed_at)
SELECT source, key, timestamptz 'epoch' + received_ms * interval '1 millisecond', arrival, event_id, payload_sha256,
       status, replay_of, attempts, last_error,
       CASE WHEN status IN ('processed', 'stale') THEN timestamptz 'epoch' + at_ms * interval '1 millisecond' END
FROM outcome
WHERE NOT (status = 'duplicate' AND (EXISTS (  -- a twin's, of the arrival that ran (see above)
    SELECT FROM processed_events p WHERE p.key = outcome.key || coalesce('#' || outcome.route, '')
                                     AND p.event_id = outcome.event_id AND p.arrival = outcome.arrival)
  OR EXISTS (  -- a twin's, of the arrival whose attempt was handed on
    SELECT FROM key_fences f WHERE f.key = outcome.key || coalesce('#' || outcome.route, '')
                               AND f.arrival = outcome.arrival AND f.payload_sha256 = outcome.payload_sha256)))
ON CONFLICT (source, key, received_at, arrival) DO UPDATE
SET status = EXCLUDED.status, replay_of = EXCLUDED.replay_of, attempts = EXCLUDED.attempts,
    last_error = coalesce(EXCLUDED.last_error, archived.last_error), completed_at = EXCLUDED.completed_at
WHERE (EXCLUDED.status <> 'duplicate' OR archived.status = 'queued'
       OR (archived.status = 'retrying'
           AND (EXCLUDED.replay_of, EXCLUDED.attempts) > (archived.replay_of, archived.attempts)))
  AND ((EXCLUDED.replay_of, EXCLUDED.attempts, event_archive_step(EXCLUDED.status))
       > (archived.replay_of, archived.attempts, event_archive_step(archived.status))
       OR (archived.status IN ('duplicate', 'conflict')
           AND (EXCLUDED.replay_of, EXCLUDED.attempts) = (archived.replay_of, archived.attempts)
           AND (EXCLUDED.status = 'dead' OR (EXCLUDED.status IN ('processed', 'stale') AND EXISTS (
               SELECT FROM outcome JOIN processed_events p ON p.key = outcome.key || coalesce('#' || outcome.route, '')
               WHERE outcome.source = archived.source AND outcome.key = archived.key
                 AND outcome.arrival = archived.arrival AND outcome.status IN ('processed', 'stale')
                 AND p.event_id = archived.event_id AND p.arrival = archived.arrival
                 AND p.completed_at > now() - make_interval(secs => $13))))))

-- fragment: dead_letters_acted_on
-- The dead letters ($1) on-call replays or discards, each with the key its
-- arrival is archived under: a route's dead letter (key KEY#ROUTE) is of the
-- arrival kept under the event's own key KEY (docs/design.md, "A routed event in the archive").
WITH acted AS (
    SELECT d.id, d.source, d.event_id, d.payload_sha256, d.received_at, d.arrival,
           CASE WHEN d.route IS NULL THEN d.key ELSE left(d.key, -(length(d.route) + 1)) END AS event_key
    FROM dead_letters d WHERE d.id = ANY($1::bigint[])
)

-- fragment: arrivals_a_dead_letter_holds
-- The arrivals an acted-on dead letter stands for: the one it names, and
-- every other arrival of its event and payload archived `dead` — a copy
-- that ran and died while the dead letter was open, which stands for it too
-- (one open dead letter per event) — unless a dead letter of the event not
-- acted on is still open (a route's, or a newer one when this one was
-- closed already): the copy is that one's.
WHERE event_archive.source = acted.source AND event_archive.key = acted.event_key
  AND ((event_archive.received_at = acted.received_at AND event_archive.arrival = acted.arrival)
       OR (event_archive.status = 'dead' AND event_archive.event_id = acted.event_id
           AND event_archive.payload_sha256 = acted.payload_sha256
           AND NOT EXISTS (
               SELECT FROM (SELECT * FROM dead_letters WHERE key = acted.event_key
                            UNION ALL
                            SELECT * FROM dead_letters
                            WHERE route IS NOT NULL AND left(key, -(length(route) + 1)) = acted.event_key) other
               WHERE other.status = 'dead' AND other.id <> ALL($1::bigint[])
                 AND other.event_id = acted.event_id AND other.payload_sha256 = acted.payload_sha256)))

-- name: archive_discarded
-- The arrivals the dead letters $1 hold, `discarded` in the discard's
-- transaction.
{{dead_letters_acted_on}}
UPDATE event_archive SET status = 'discarded'
FROM acted
{{arrivals_a_dead_letter_holds}}

-- name: archive_replayed
-- The arrivals the dead letter $1 (an array of one) holds, replayed as chain
-- $2 (dead_letter_replays.id), in the replay's transaction: `queued` again
-- in that chain, which their outcomes step on from (and the sweep, reading
-- only queued and retrying rows, settles them should they be lost). The
-- arrival it names starts again at attempt 0; a copy keeps its attempts.
-- The replay runs the arrival named, and the sweep settles the copies from
-- its end: copies of its run (`duplicate`), or `dead` again.
{{dead_letters_acted_on}}
UPDATE event_archive
SET status = 'queued', replay_of = $2,
    attempts = CASE WHEN event_archive.received_at = acted.received_at AND event_archive.arrival = acted.arrival
                    THEN 0 ELSE event_archive.attempts END
FROM acted
{{arrivals_a_dead_letter_holds}}
  AND event_archive.replay_of < $2

-- name: archive_unsettled
-- The settling sweep's page (shared/archive/settling.py): rows still
-- queued or retrying, received more than $1 seconds ago and after the row
-- named ($2 received_at, $6 source, $7 key, $8 arrival: the last page's
-- last; NULL: from the oldest), in that order, at most $3 (read from the
-- partial index of unsettled rows on that whole name, migration 0022, the
-- page first: a backlog is never read whole, and rows sharing the last
-- one's millisecond are not skipped); each
-- with what Postgres recorded of its event more than $1 seconds ago, under
-- its key or one of its routes' (`KEY#ROUTE`; $4 sources, $5 their routes)
-- and with its event id (event evt_a's route billing and event
-- evt_a#billing share a key: docs/design.md, "Routes"): a completion, the
-- dead letter of its payload (open first), and whether an arrival of its
-- key is archived processed already. The completion read is one that
-- names this arrival if any (a route's), else one naming none (from
-- before 0020: the sweep guesses), else another arrival's.
SELECT a.source, a.key, a.received_at, a.arrival, a.status, a.attempts, a.replay_of, a.payload_sha256,
       done.payload_sha256 AS completed_sha256, done.attempts AS completed_attempts, done.completed_at,
       done.arrival AS completed_arrival, done.stale AS completed_stale,
       dead.status AS dead_letter, dead.attempts AS dead_attempts, dead.own AS own_dead_letter,
       EXISTS (SELECT FROM event_archive p WHERE p.source = a.source AND p.key = a.key
                                              AND p.status IN ('processed', 'stale'))
           AS processed_already
FROM (SELECT source, key, received_at, arrival, event_id, status, attempts, replay_of, payload_sha256 FROM event_archive
      WHERE status IN ('queued', 'retrying') AND received_at < now() - make_interval(secs => $1)
        AND (received_at, source, key, arrival) > (coalesce($2::timestamptz, '-infinity'), coalesce($6::text, ''),
                                                   coalesce($7::text, ''), coalesce($8::int8, -9223372036854775808))
      ORDER BY received_at, source, key, arrival
      LIMIT $3) a
CROSS JOIN LATERAL (
    SELECT a.key || coalesce((SELECT array_agg(a.key || '#' || r.route) FROM unnest($4::text[], $5::text[])
                                  AS r(source, route) WHERE r.source = a.source), '{}') AS keys) named
LEFT JOIN LATERAL (
    SELECT p.payload_sha256, p.attempts, p.completed_at, p.arrival, p.stale FROM processed_events p
    WHERE p.key = ANY(named.keys) AND p.event_id = a.event_id AND p.completed_at < now() - make_interval(secs => $1)
    ORDER BY p.arrival IS NOT DISTINCT FROM a.arrival DESC, p.arrival IS NULL DESC
    LIMIT 1) done ON true
LEFT JOIN LATERAL (
    SELECT d.status, d.attempts, d.received_at = a.received_at AND d.arrival = a.arrival AS own FROM dead_letters d
    WHERE d.key = ANY(named.keys) AND d.event_id = a.event_id AND d.payload_sha256 = a.payload_sha256
      AND d.status IN ('dead', 'discarded')
      AND d.updated_at < now() - make_interval(secs => $1)
    ORDER BY d.status = 'dead' DESC, d.id DESC LIMIT 1) dead ON true
ORDER BY a.received_at, a.source, a.key, a.arrival

-- name: archive_unsettled_of_pruned
-- archive_unsettled's columns for the rows still queued or retrying of the
-- events whose completions `prune` is deleting ($1-$7: the key, source,
-- event id, payload, attempts, completion time and arrival of each, as its
-- DELETE returned them; $8 whether it is `stale`), in its transaction: once the record is gone no
-- sweep can say what became of them. Each row with those completions as
-- the sweep reads processed_events (the one naming this arrival first, else
-- one naming none, else another's; no grace: this is the last look), the
-- dead letter of its payload (open first) and whether an arrival of its key
-- is archived processed already; each key's rows oldest first. An event's
-- rows are under its own key SOURCE:EVENT_ID (one join of the completions
-- with the archive: a lateral scan of them per row was 5,000 x 5,000
-- comparisons, 7.7 s a batch); its routes' completions under KEY#ROUTE, carrying its
-- event id (a replay's run, replay-R/KEY, is not its arrival's end); its
-- routes' dead letters are found by the event's key
-- (dead_letters_route_event_key), as on its page.
WITH pruned AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int4[], $6::timestamptz[], $7::int8[],
                         $8::bool[])
        AS pruned(key, source, event_id, payload_sha256, attempts, completed_at, arrival, stale)
    WHERE pruned.key = pruned.source || ':' || pruned.event_id
       OR starts_with(pruned.key, pruned.source || ':' || pruned.event_id || '#')
)
SELECT DISTINCT ON (a.source, a.key, a.received_at, a.arrival)
       a.source, a.key, a.received_at, a.arrival, a.status, a.attempts, a.replay_of, a.payload_sha256,
       done.payload_sha256 AS completed_sha256, done.attempts AS completed_attempts, done.completed_at,
       done.arrival AS completed_arrival, done.stale AS completed_stale,
       dead.status AS dead_letter, dead.attempts AS dead_attempts, dead.own AS own_dead_letter,
       EXISTS (SELECT FROM event_archive p WHERE p.source = a.source AND p.key = a.key
                                              AND p.status IN ('processed', 'stale'))
           AS processed_already
FROM pruned done
JOIN event_archive a ON a.source = done.source AND a.key = done.source || ':' || done.event_id
                    AND a.event_id = done.event_id AND a.status IN ('queued', 'retrying')
LEFT JOIN LATERAL (
    SELECT d.status, d.attempts, d.received_at = a.received_at AND d.arrival = a.arrival AS own
    FROM (SELECT * FROM dead_letters WHERE key = a.key
          UNION ALL
          SELECT * FROM dead_letters WHERE route IS NOT NULL AND left(key, -(length(route) + 1)) = a.key) d
    WHERE d.event_id = a.event_id AND d.payload_sha256 = a.payload_sha256 AND d.status IN ('dead', 'discarded')
    ORDER BY d.status = 'dead' DESC, d.id DESC LIMIT 1) dead ON true
-- each key's rows oldest first (shared/archive/settling.py's guess reads them so); each row once, with the
-- completion that names its arrival first, else one naming none, else another's
ORDER BY a.source, a.key, a.received_at, a.arrival, done.arrival IS NOT DISTINCT FROM a.arrival DESC,
         done.arrival IS NULL DESC

-- name: archive_settle_named
-- The arrivals the completions of a window name (processed_events.arrival)
-- still archived `duplicate` or `conflict`, made `processed` (`stale` for
-- a stale completion, migration 0028): the arrival's
-- own run is its end (docs/design.md, "The settling sweep"). Such a row is a note
-- written of it before its run — by `prune`, settling it a copy of the
-- completion it deleted while its message was still on its way, or a twin
-- that still found another payload's completion — whose run's own note
-- was then lost with its worker; the sweep reads only queued and retrying
-- rows. The window: completions after ($1 completed_at, $2 key: the last
-- read; NULL: none yet), none older than $5 seconds before the grace,
-- completed more than $3 seconds ago (the grace: the run's own note may be
-- on its way), in that order, at most $4, read from
-- processed_events_completed_at; each arrival they name is a primary-key
-- probe of its source's days. Not a completion naming none (the sweep's
-- guess), nor a replay's run (replay-R/KEY is not its arrival's end); a
-- route's (KEY#ROUTE) names the arrival kept under KEY. Not over a row
-- whose payload has an open dead letter (the sweep's `dead` comes first),
-- nor when another arrival of the key is archived `processed` at this very
-- completion's time: a sweep's guess of which copy ran (the previous
-- release's, during an upgrade) — one run, one `processed`. Returns the
-- rows settled, the completions read and the last one read (where the next
-- page starts).
WITH page AS (
    SELECT p.key, p.source, p.event_id, p.payload_sha256, p.attempts, p.completed_at, p.arrival, p.stale
    FROM processed_events p
    WHERE p.completed_at >= greatest(coalesce($1::timestamptz, '-infinity'),
                                     now() - make_interval(secs => $3::float8 + $5::float8))
      AND (p.completed_at, p.key) > (coalesce($1::timestamptz, '-infinity'), coalesce($2::text, ''))
      AND p.completed_at < now() - make_interval(secs => $3)
    ORDER BY p.completed_at, p.key
    LIMIT $4
), named AS (
    SELECT * FROM page
    WHERE page.arrival IS NOT NULL AND page.arrival <> 0
      AND (page.key = page.source || ':' || page.event_id
           OR starts_with(page.key, page.source || ':' || page.event_id || '#'))
), settled AS (
    UPDATE event_archive AS a
    SET status = CASE WHEN n.stale THEN 'stale' ELSE 'processed' END, attempts = greatest(a.attempts, n.attempts),
        completed_at = n.completed_at
    FROM named n
    WHERE a.source = n.source AND a.key = n.source || ':' || n.event_id AND a.arrival = n.arrival
      AND a.event_id = n.event_id AND a.payload_sha256 = n.payload_sha256
      AND a.status IN ('duplicate', 'conflict')
      AND NOT EXISTS (
          SELECT FROM event_archive o
          WHERE o.source = a.source AND o.key = a.key AND o.status IN ('processed', 'stale')
            AND o.completed_at = n.completed_at AND o.arrival <> a.arrival)
      AND NOT EXISTS (
          SELECT FROM (SELECT * FROM dead_letters WHERE key = a.key
                       UNION ALL
                       SELECT * FROM dead_letters WHERE route IS NOT NULL AND left(key, -(length(route) + 1)) = a.key) d
          WHERE d.event_id = a.event_id AND d.payload_sha256 = a.payload_sha256 AND d.status = 'dead')
    RETURNING 1
)
SELECT (SELECT count(*) FROM settled) AS settled, (SELECT count(*) FROM page) AS read,
       last.completed_at, last.key
FROM (SELECT 1) one
LEFT JOIN (SELECT completed_at, key FROM page ORDER BY completed_at DESC, key DESC LIMIT 1) last ON true

-- name: archive_settle
-- The sweep's decisions: each row brought to its event's end, only while
-- it is still as the sweep read it (status $5, attempts $6, chain $10: a
-- dead letter replayed meanwhile leaves it queued at attempt 0 again, in
-- the replay's chain, which the end read of the chain before is not); a
-- live outcome written meanwhile wins, and the next round looks again.
-- $11, $12: the first and last receive time of the rows.
UPDATE event_archive AS a
SET status = s.status, attempts = s.attempts, completed_at = coalesce(s.completed_at, a.completed_at)
FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::int8[], $5::text[], $6::int4[], $7::text[], $8::int4[],
            $9::timestamptz[], $10::int8[])
     AS s(source, key, received_at, arrival, was, was_attempts, status, attempts, completed_at, was_replay_of)
WHERE a.source = s.source AND a.key = s.key AND a.received_at = s.received_at AND a.arrival = s.arrival
  AND a.status = s.was AND a.attempts = s.was_attempts AND a.replay_of = s.was_replay_of
  -- the page's range of the unsettled rows' index, not every partition whole
  AND a.status IN ('queued', 'retrying') AND a.received_at BETWEEN $11 AND $12

-- name: archive_keep
-- One source's tables (event_archive_keep); a lock it waits for longer than
-- the caller's lock_timeout fails it, to be tried again later.
SELECT made, dropped FROM event_archive_keep($1, $2, $3, $4, $5)

-- name: archive_sizes
-- Bytes on disk of each source's days ($1 sources, $2 their tables), indexes and TOAST included.
SELECT source, coalesce((SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree(to_regclass(source_table))
                         WHERE isleaf), 0)::int8 AS bytes
FROM unnest($1::text[], $2::text[]) AS archived(source, source_table)

-- searching the event archive (shared/archive/search.py: the filter, the
-- documents). A `queued` row whose key's lease is held is shown `processing`:
-- for a source with routes (the statement's last two arguments: the sources
-- file's sources and their route names, SourceRoutes), a lease on one of its
-- routes' keys, KEY#ROUTE, never on KEY (a routed event never runs under its
-- own key, and event `evt#b`'s key is event `evt`'s route `b`'s); for
-- the others, on KEY. `held` is read per queued row only (docs/design.md,
-- "Routes").

-- fragment: archive_held(sources, routes)
-- `held.processing` of each archived row `a` (above): $sources and $routes
-- the sources file's routes (SourceRoutes).
CROSS JOIN LATERAL (SELECT a.status = 'queued' AND CASE WHEN a.source = ANY($sources::text[])
    THEN EXISTS (SELECT FROM unnest($sources::text[], $routes::text[]) AS r(source, route)
                 WHERE r.source = a.source AND EXISTS (
                     SELECT FROM key_fences WHERE key_fences.key = a.key || '#' || r.route
                                              AND key_fences.lease_until > clock_timestamp()))
    ELSE EXISTS (SELECT FROM key_fences WHERE key_fences.key = a.key AND key_fences.lease_until > clock_timestamp())
    END AS processing) held

-- fragment: archive_filter
-- The archive's filter, as search_archive, export_archive, count_archive
-- and a replay by selection (shared/replays/queries.sql) read it, after
-- `held` (a row's `processing`: its key's lease): $1 source, $2 status
-- (also 'processing'), $3 event type, $4 received at or after, $5 received
-- before, $6 key prefix, $7 event id prefix, $8 payload containment
-- (jsonb); NULL: no filter. Each statement adds its own conditions after
-- it (search_archive's next page, the replays' only replayable rows).
WHERE ($1::text IS NULL OR a.source = $1)
  AND ($2::text IS NULL OR CASE $2 WHEN 'processing' THEN a.status = 'queued' AND held.processing
                                  WHEN 'queued' THEN a.status = 'queued' AND NOT held.processing
                                  ELSE a.status = $2 END)
  AND ($3::text IS NULL OR a.event_type = $3)
  AND ($4::timestamptz IS NULL OR a.received_at >= $4)
  AND ($5::timestamptz IS NULL OR a.received_at < $5)
  AND ($6::text IS NULL OR starts_with(a.key, $6))
  AND ($6::text IS NULL OR strpos($6, ':') = 0 OR a.source = split_part($6, ':', 1))
  AND ($6::text IS NULL OR strpos($6, ':') = 0 OR starts_with(a.event_id, substr($6, strpos($6, ':') + 1)))
  AND ($7::text IS NULL OR starts_with(a.event_id, $7))
  AND ($8::jsonb IS NULL OR event_archive_payload(a.body) @> $8)

-- name: search_archive
-- One page, newest first: $1 source, $2 status (also 'processing'), $3
-- event type, $4 received at or after, $5 received before, $6 key prefix,
-- $7 event id prefix, $8 payload containment (jsonb), $9-$12 only rows
-- older than this (received_at, source, key, arrival): the next page; $13
-- its size; $14, $15 the sources file's routes (above).
-- NULL: no filter. A key prefix with a ':' also names its source (a key
-- is SOURCE:EVENT_ID, as archived_arrivals reads it): only that source's
-- tables are planned and read, and the rest of it is their event ids'
-- prefix, which their event id index serves (migration 0024).
-- 'processing' also says `a.status = 'queued'` (held.processing implies
-- it), which the unsettled index serves: held's own test was read off
-- every row. The event id prefix's index and the others: migration 0019.
SELECT a.source, a.key, a.received_at, a.arrival, a.event_id, a.event_type, a.payload_sha256, a.attempts,
       a.last_error, a.completed_at, a.replay_of, a.ignore_rule, CASE WHEN held.processing THEN 'processing' ELSE a.status END AS status
FROM event_archive a
{{archive_held($14, $15)}}
{{archive_filter}}
  AND ($9::timestamptz IS NULL OR (a.received_at, a.source, a.key, a.arrival) < ($9, $10::text, $11::text, $12::int8))
ORDER BY a.received_at DESC, a.source DESC, a.key DESC, a.arrival DESC
LIMIT $13

-- name: export_archive
-- search_archive's page ($1-$15) with what each row carried (body, headers):
-- `webhook-ingest events export` streams a selection page by page.
SELECT a.source, a.key, a.received_at, a.arrival, a.event_id, a.event_type, a.payload_sha256, a.body, a.headers,
       a.attempts, a.last_error, a.completed_at, a.replay_of, a.ignore_rule,
       CASE WHEN held.processing THEN 'processing' ELSE a.status END AS status
FROM event_archive a
{{archive_held($14, $15)}}
{{archive_filter}}
  AND ($9::timestamptz IS NULL OR (a.received_at, a.source, a.key, a.arrival) < ($9, $10::text, $11::text, $12::int8))
ORDER BY a.received_at DESC, a.source DESC, a.key DESC, a.arrival DESC
LIMIT $13

-- name: count_archive
-- How many rows search_archive's filter ($1-$8) matches, up to $9; $10, $11
-- the sources file's routes.
SELECT count(*) FROM (
    SELECT FROM event_archive a
    {{archive_held($10, $11)}}
    {{archive_filter}}
    LIMIT $9
) capped

-- name: archived_arrivals
-- Every arrival of a key, oldest first: the event, its copies, its conflicts;
-- `processing` as the searches', $2 the route names of the key's source.
SELECT a.source, a.key, a.received_at, a.event_id, a.event_type, a.payload_sha256, a.body, a.headers, a.attempts,
       a.last_error, a.completed_at, a.replay_of, a.ignore_rule,
       CASE WHEN a.status = 'queued' AND CASE WHEN cardinality($2::text[]) > 0
           THEN EXISTS (SELECT FROM unnest($2::text[]) AS route WHERE EXISTS (
                            SELECT FROM key_fences WHERE key_fences.key = a.key || '#' || route
                                                     AND key_fences.lease_until > clock_timestamp()))
           ELSE EXISTS (SELECT FROM key_fences WHERE key_fences.key = a.key AND key_fences.lease_until > clock_timestamp())
           END
       THEN 'processing' ELSE a.status END AS status
FROM event_archive a
WHERE a.source = split_part($1, ':', 1) AND a.key = $1
ORDER BY a.received_at, a.arrival

-- name: archive_copies
-- How many copies (`duplicate`) and conflicts each key of a page ($2; $1
-- their sources) has in the archive: the console's Events columns.
SELECT a.key, count(*) FILTER (WHERE a.status = 'duplicate') AS copies,
       count(*) FILTER (WHERE a.status = 'conflict') AS conflicts
FROM event_archive a
WHERE a.source = ANY($1::text[]) AND a.key = ANY($2::text[])
GROUP BY a.key

-- name: archived_event_records
-- What the pipeline itself recorded of key $1, event id $2: its completion
-- (until `prune`), each of its routes' ($3, its source's route names, in
-- the file's order: [name, completion or null]), and its dead letters, its
-- routes' (KEY#ROUTE, with `route`) too. A completion is the event's only
-- with its event id: event `evt`'s route `b` completes under `evt#b`'s key,
-- carrying `evt` (docs/design.md, "Routes").
SELECT (SELECT to_jsonb(p) - 'fencing_token' FROM processed_events p WHERE p.key = $1 AND p.event_id = $2)
           AS completion,
       coalesce((SELECT jsonb_agg(jsonb_build_array(r.route, (SELECT to_jsonb(p) - 'fencing_token'
                                                               FROM processed_events p
                                                               WHERE p.key = $1 || '#' || r.route
                                                                 AND p.event_id = $2))
                                  ORDER BY r.place)
                 FROM unnest($3::text[]) WITH ORDINALITY AS r(route, place)),
                '[]') AS route_completions,
       coalesce((SELECT jsonb_agg(jsonb_build_object('id', d.id, 'status', d.status, 'attempts', d.attempts,
                                                     'received_at', d.received_at, 'created_at', d.created_at)
                                  || CASE WHEN d.route IS NULL THEN '{}'::jsonb
                                          ELSE jsonb_build_object('route', d.route) END
                                  ORDER BY d.id)
                 FROM dead_letters d
                 WHERE (d.key = $1 AND d.route IS NULL)  -- not event `evt`'s route `b` on `evt#b`'s page
                    OR (d.route IS NOT NULL AND left(d.key, -(length(d.route) + 1)) = $1)),
                '[]') AS dead_letters

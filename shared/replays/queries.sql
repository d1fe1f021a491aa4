-- Named SQL of shared/replays/ (loaded by shared.db.queries.load_queries).

-- replays by selection (shared/replays/store.py) -------------------------
-- The selection is the archive's filter ($1-$8: archive_filter, a fragment of
-- shared/archive/queries.sql, as search_archive's WHERE), the
-- events it matches by key: one arrival per key (the oldest matched), never
-- an ignored arrival (never queued), a conflicting one (its payload never
-- ran) or one whose body the archive lacks.

-- name: count_event_replay
-- How many events a replay of the filter ($1-$8) would freeze now: the dry
-- run; $9, $10 the sources file's routes.
SELECT count(DISTINCT a.key) FROM event_archive a
{{archive_held($9, $10)}}
{{archive_filter}}
  AND a.status NOT IN ('ignored', 'conflict') AND a.body IS NOT NULL

-- name: insert_event_replay
-- A replay of the filter ($1-$8) frozen now, asked by $9 with its filter as
-- $10 ($11, $12 the sources file's routes): the replay's row and its items, numbered in the order received, in
-- one statement (one snapshot: what the count said is what is frozen).
WITH selected AS (
    SELECT DISTINCT ON (a.key) a.source, a.key, a.received_at FROM event_archive a
    {{archive_held($11, $12)}}
    {{archive_filter}}
      AND a.status NOT IN ('ignored', 'conflict') AND a.body IS NOT NULL
    ORDER BY a.key, a.received_at
), replay AS (
    INSERT INTO event_replays (filter, total, created_by)
    SELECT $10::jsonb, count(*), $9 FROM selected
    RETURNING id
), items AS (
    INSERT INTO event_replay_items (replay_id, item, source, key, received_at)
    SELECT replay.id, row_number() OVER (ORDER BY s.received_at, s.source, s.key), s.source, s.key, s.received_at
    FROM replay, selected s
)
SELECT id FROM replay

-- name: get_event_replay
-- The replay, and whether a Cancel counted an item published that its
-- runner, dead mid-publish, never stepped (cancel_event_replay).
SELECT r.*, coalesce(f.in_doubt, false) AS in_doubt FROM event_replays r
LEFT JOIN paced_run_in_flight f ON f.kind = 'event_replay' AND f.run_id = r.id
WHERE r.id = $1

-- name: event_replay_items
-- Items $2 and after of replay $1, in order, at most $3.
SELECT item, source, key, received_at FROM event_replay_items
WHERE replay_id = $1 AND item >= $2 ORDER BY item LIMIT $3

-- name: event_replay_arrival
-- What a replay publishes of one frozen item: its arrival as archived (of
-- arrivals sharing its millisecond, one the selection could have chosen).
SELECT source, key, received_at, event_id, payload_sha256, body, headers FROM event_archive
WHERE source = $1 AND key = $2 AND received_at = $3
ORDER BY body IS NULL, status IN ('ignored', 'conflict'), arrival LIMIT 1

-- name: claim_event_replay
-- Start (or resume) at $2 per second: only one process runs it. A run whose
-- process died (no step for 30 s plus two of its intervals) may be resumed.
UPDATE event_replays
SET state = 'running', rate = $2, error = NULL, started_at = coalesce(started_at, now()), stepped_at = now()
WHERE id = $1 AND (state IN ('prepared', 'failed')
                   OR (state = 'running' AND stepped_at < now() - make_interval(secs => 30 + 2 / rate)))
RETURNING *

-- name: event_replay_step
-- Item $2 handled: published ($3 true) or skipped. Only in order, once, and
-- only by the runner whose last step (or claim) wrote stepped_at $4: a
-- runner whose stalled run was claimed again elsewhere gets no row back.
UPDATE event_replays
SET next_item = $2 + 1, published = published + $3::boolean::integer,
    skipped = skipped + (NOT $3)::integer, stepped_at = now()
WHERE id = $1 AND next_item = $2 AND stepped_at = $4
RETURNING stepped_at

-- name: finish_event_replay
-- By the runner that holds it ($4: its last stepped_at), never by one whose run was claimed again.
UPDATE event_replays SET state = $2, error = $3, finished_at = now()
WHERE id = $1 AND state = 'running' AND stepped_at = $4

-- name: cancel_event_replay
-- Under the run's lock (shared/runs/locks.py: no runner is mid-item). An item
-- marked in flight and not stepped (its runner died, or its publish failed,
-- once it may have been sent) is counted published and handled, and marked
-- in doubt: what a cancel reports published is all that can have gone out.
WITH run AS (
    SELECT r.id, f.item IS NOT NULL AS in_doubt FROM event_replays r
    LEFT JOIN paced_run_in_flight f ON f.kind = 'event_replay' AND f.run_id = r.id AND f.item = r.next_item
    WHERE r.id = $1 AND r.state IN ('prepared', 'running', 'failed')
), doubted AS (
    UPDATE paced_run_in_flight f SET in_doubt = true FROM run
    WHERE f.kind = 'event_replay' AND f.run_id = run.id AND run.in_doubt
)
UPDATE event_replays r SET state = 'cancelled', finished_at = now(),
    next_item = r.next_item + run.in_doubt::integer, published = r.published + run.in_doubt::integer
FROM run WHERE r.id = run.id
RETURNING r.id, run.in_doubt

-- name: event_replay_in_flight
-- Item $2 of replay $1 about to be published, committed before its publish
-- (cancel_event_replay reads it when the runner never stepped it). Once in
-- doubt, a replay stays so: its published count holds one that may not
-- have gone out.
INSERT INTO paced_run_in_flight (kind, run_id, item) VALUES ('event_replay', $1, $2)
ON CONFLICT (kind, run_id) DO UPDATE SET item = EXCLUDED.item, marked_at = now()

-- name: event_replay_doubted
-- A replay counted an item published that may not have gone out: its
-- runner died with it in flight, and its successor skipped it.
UPDATE paced_run_in_flight SET in_doubt = true WHERE kind = 'event_replay' AND run_id = $1

-- name: lock_event_replay
-- The runner's hold of its replay for one item: the state it acts on, and
-- the row locked until the item's step commits (a cancel waits for it).
-- `orphaned`: the item is marked in flight by a runner that never stepped it.
SELECT r.state, r.stepped_at, f.item IS NOT NULL AS orphaned FROM event_replays r
LEFT JOIN paced_run_in_flight f ON f.kind = 'event_replay' AND f.run_id = r.id AND f.item = r.next_item
WHERE r.id = $1 FOR UPDATE OF r

-- name: replays_of_event
-- The replays by selection whose frozen items hold the key $1, newest first,
-- at most $2: each replay's state, who asked, whether its item was handled
-- (published or skipped), its run's completion (under replay-R/KEY) and,
-- for a source with routes ($3, its route names in the file's order), each
-- route's run's (replay-R/KEY#ROUTE), null when not completed. A completion
-- is the event's only with its event id (KEY's after SOURCE:): event `evt`'s
-- route `b` completes under event `evt#b`'s key (docs/design.md, "Routes").
SELECT r.id, r.state, r.created_by, r.created_at, r.next_item > i.item AS handled,
       (SELECT p.completed_at FROM processed_events p
        WHERE p.key = 'replay-' || r.id || '/' || i.key AND p.event_id = substr($1, strpos($1, ':') + 1))
           AS completed_at,
       array(SELECT (SELECT p.completed_at FROM processed_events p
                     WHERE p.key = 'replay-' || r.id || '/' || i.key || '#' || route.name
                       AND p.event_id = substr($1, strpos($1, ':') + 1))
             FROM unnest($3::text[]) WITH ORDINALITY AS route(name, place)
             ORDER BY route.place) AS route_completed_at
FROM event_replay_items i
JOIN event_replays r ON r.id = i.replay_id
WHERE i.key = $1
ORDER BY r.id DESC
LIMIT $2

-- pruning the frozen selections of ended replays (shared/upkeep.py) ----
-- An item of a replay that ended (`done` or `cancelled`: never claimed
-- again) a while ago goes once no arrival of its key is archived: then its
-- event has no page, the one place an ended replay's items show (its
-- progress is the replay's row). Each replay is walked in passes
-- (event_replay_prune_passes, migration 0025): a statement reads the next
-- page of items from the pass's position, deletes the gone ones, skips the
-- archived ones and moves the position past the page, so an archived item
-- never holds back the ones after it. Past the last item, the pass is over;
-- the next begins at the first item left no sooner than $3 seconds after
-- it began, to read the skipped items again.

-- name: event_replays_to_prune
-- The replays that ended more than $1 seconds ago with items left that a
-- pass has still to read: none begun, one under way, or one over that
-- began more than $3 seconds ago; oldest first, at most $2.
-- The last item left read as max(): one backward probe of the items' primary key per replay,
-- whatever the statistics say (an EXISTS became a seq scan each when one replay held every item).
SELECT r.id FROM event_replays r
LEFT JOIN event_replay_prune_passes p ON p.replay_id = r.id
CROSS JOIN LATERAL (SELECT max(i.item) AS item FROM event_replay_items i WHERE i.replay_id = r.id) last
WHERE r.state IN ('done', 'cancelled') AND r.finished_at < now() - make_interval(secs => $1)
  AND last.item IS NOT NULL
  AND (last.item >= p.next_item
       OR p.replay_id IS NULL OR p.pass_started_at < now() - make_interval(secs => $3))
ORDER BY r.id
LIMIT $2

-- name: prune_event_replay_items
-- Of replay $1, if it ended more than $2 seconds ago, the next $3 items of
-- its pass (from its position; from the first item left when none has
-- begun, or when the last is over and began more than $4 seconds ago):
-- those whose event is no longer archived deleted, the others skipped, the
-- pass's position moved past them. Items another process is reading are
-- left to it (SKIP LOCKED), so upkeeps at once share the work; the
-- position only moves forward within a pass (GREATEST), and a new pass is
-- begun once (the pass row read must be the one still there); a statement
-- that read the last pass leaves a new one's position alone (its page was
-- the last pass's). How many were deleted and how many read.
WITH pass AS (
    SELECT CASE WHEN p.replay_id IS NULL THEN 1
                WHEN EXISTS (SELECT FROM event_replay_items i WHERE i.replay_id = r.id AND i.item >= p.next_item)
                    THEN p.next_item
                WHEN p.pass_started_at < now() - make_interval(secs => $4) THEN 1
           END AS start,
           p.replay_id IS NULL OR NOT EXISTS (SELECT FROM event_replay_items i
                                              WHERE i.replay_id = r.id AND i.item >= p.next_item) AS begins,
           p.pass_started_at AS began
    FROM event_replays r
    LEFT JOIN event_replay_prune_passes p ON p.replay_id = r.id
    WHERE r.id = $1 AND r.state IN ('done', 'cancelled') AND r.finished_at < now() - make_interval(secs => $2)
), page AS (
    SELECT i.item, i.source, i.key FROM event_replay_items i
    WHERE i.replay_id = $1 AND i.item >= (SELECT start FROM pass)  -- a bound of the index's range
    ORDER BY i.item
    LIMIT $3
    FOR UPDATE OF i SKIP LOCKED
), judged AS (
    SELECT page.item, EXISTS (SELECT FROM event_archive a WHERE a.source = page.source AND a.key = page.key) AS archived
    FROM page
), deleted AS (
    DELETE FROM event_replay_items i USING judged
    WHERE i.replay_id = $1 AND i.item = judged.item AND NOT judged.archived
    RETURNING i.item
), moved AS (
    INSERT INTO event_replay_prune_passes AS p (replay_id, next_item)
    SELECT $1, coalesce((SELECT max(item) + 1 FROM judged), pass.start) FROM pass WHERE pass.start IS NOT NULL
    ON CONFLICT (replay_id) DO UPDATE
    SET next_item = CASE WHEN (SELECT begins FROM pass) AND p.pass_started_at = (SELECT began FROM pass)
                             THEN EXCLUDED.next_item
                         -- read in the last pass, and the next began since: its position is not this one's
                         WHEN NOT (SELECT begins FROM pass) AND p.pass_started_at <> (SELECT began FROM pass)
                             THEN p.next_item
                         ELSE greatest(p.next_item, EXCLUDED.next_item) END,
        pass_started_at = CASE WHEN (SELECT begins FROM pass) AND p.pass_started_at = (SELECT began FROM pass)
                               THEN now() ELSE p.pass_started_at END
)
SELECT (SELECT count(*) FROM deleted) AS deleted, count(*) AS read FROM judged

-- name: sources_with_lanes
-- Of the sources $1 (NULL: every source), those with an ordering lane
-- (docs/design.md, "Ordering keys"): a replay of them needs the sources
-- file, which says which lane each event goes to.
SELECT DISTINCT source FROM ordering_keys WHERE $1::text[] IS NULL OR source = ANY($1::text[]) ORDER BY source

-- One failed attempt, at most one next attempt (docs/design.md, "One next attempt per failed attempt").

-- The key's last attempt handed on (its retry message confirmed, or its
-- dead letter committed), the chain it belongs to (`replay_of`: the replay,
-- dead_letter_replays.id, it started from; 0 for the ingress's event) and
-- its payload: a message with that payload for an attempt up to that one
-- is a copy, acked without running (workers/claim/attempts.py).
ALTER TABLE key_fences ADD COLUMN replay_of bigint NOT NULL DEFAULT 0;
ALTER TABLE key_fences ADD COLUMN attempt integer NOT NULL DEFAULT 0;
ALTER TABLE key_fences ADD COLUMN payload_sha256 text;

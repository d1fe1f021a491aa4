-- Named SQL of shared/sources/ (loaded by shared.db.queries.load_queries).

-- paused sources (shared/sources/pauses.py) -------------------------------------------

-- name: paused_sources
SELECT source, paused_at, paused_by FROM source_pauses ORDER BY source

-- name: pause_source
INSERT INTO source_pauses (source, paused_by) VALUES ($1, $2) ON CONFLICT (source) DO NOTHING RETURNING source

-- name: resume_source
-- $2, who resumed it, is in the audit log only.
DELETE FROM source_pauses WHERE source = $1 AND $2::text IS NOT NULL RETURNING source

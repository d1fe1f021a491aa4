-- Named SQL of shared/audit/ (loaded by shared.db.queries.load_queries).

-- name: insert_audit
INSERT INTO audit_log (role, name, via, action, dead_letter_ids, detail)
VALUES ($1, $2, $3, $4, $5::bigint[], $6::jsonb)
RETURNING id

-- name: list_audit
-- Newest first; $1 only entries naming this dead letter (NULL: all), $2
-- only ids below this one (the next page), $3 page size.
SELECT id, at, role, name, via, action, dead_letter_ids, detail
FROM audit_log
WHERE ($1::bigint IS NULL OR dead_letter_ids @> ARRAY[$1::bigint])
  AND ($2::bigint IS NULL OR id < $2)
ORDER BY id DESC
LIMIT $3

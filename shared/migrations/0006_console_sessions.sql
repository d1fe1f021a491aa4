-- The console's sessions, kept by the server (docs/security.md, "Console sessions").

-- The key that encrypts and authenticates the console's cookies: random,
-- made by the first ingress process that needs it and read by the others
-- (a sign-in served by one process is good in all). Nothing about it
-- follows from the operator token, so a cookie confirms no guess of it.
CREATE TABLE console_session_key (
    only_row    boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    key         bytea NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- One row per sign-in. The cookie carries the session's random id; the
-- server keeps only its SHA-256. A session is good while its row has no
-- `ended_at`, its `expires_at` is ahead and the token that signed it in
-- (`token_fingerprint`, an HMAC under the key above) is still configured:
-- signing out, or rotating the token, ends it for every copy of the cookie.
CREATE TABLE console_sessions (
    id_sha256   bytea PRIMARY KEY,
    role        text NOT NULL,
    token_fingerprint bytea NOT NULL,
    client      text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    ended_at    timestamptz
);
CREATE INDEX console_sessions_expires_at ON console_sessions (expires_at);

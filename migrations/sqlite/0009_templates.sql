-- Request templates (issue 15).
-- 1. Each attempt keeps the requests a template rendered and the answers (`request`, JSON: one entry
--    per HTTP request of the attempt, secrets redacted), and two more error classes: `template` (a
--    template failed to render: the delivery fails at once) and `held` (the full-state removal guard
--    holds the declaration until confirmed). SQLite cannot alter a CHECK constraint, so the table is
--    rebuilt with the same rows and ids, as in 0008.
CREATE TABLE attempts_new (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    delivery_id   INTEGER NOT NULL REFERENCES deliveries (id) ON DELETE CASCADE,
    started_at    INTEGER NOT NULL,
    duration_ms   INTEGER NOT NULL,
    status_code   INTEGER,
    error_class   TEXT CHECK (error_class IN ('timeout', 'connect', 'tls', 'forbidden_address', 'redirect', 'http',
                                              'template', 'held')),
    error         TEXT,
    location      TEXT,      -- Location header of a 3xx
    response_body TEXT,      -- at most 4 KiB of the (last) response body
    request       TEXT       -- templated endpoints: JSON array of {name, method, url, headers, body, status, response, error}
);
INSERT INTO attempts_new (id, delivery_id, started_at, duration_ms, status_code, error_class, error, location, response_body)
    SELECT id, delivery_id, started_at, duration_ms, status_code, error_class, error, location, response_body FROM attempts;
DROP TABLE attempts;
ALTER TABLE attempts_new RENAME TO attempts;
CREATE INDEX attempts_by_delivery ON attempts (delivery_id, id);

-- 2. Full-state endpoints: what the appliance last accepted (the removal guard's reference), and a
--    declaration the guard holds until an operator confirms it.
CREATE TABLE full_state (
    webhook          TEXT PRIMARY KEY NOT NULL,
    told             TEXT    NOT NULL DEFAULT '[]',  -- JSON array of "namespace/name", sorted
    told_at          INTEGER,                        -- when the appliance accepted it (Unix ms)
    held_digest      TEXT,                           -- sha256 of the held declaration's Service set
    held_removed     INTEGER,                        -- Services it would remove
    held_total       INTEGER,                        -- of how many told
    held_at          INTEGER,
    confirmed_digest TEXT                            -- the held set an operator confirmed
) WITHOUT ROWID;

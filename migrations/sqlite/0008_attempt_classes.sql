-- Attempt error classes gain `forbidden_address`: a webhook host that resolves only to link-local or
-- cloud-metadata addresses is refused at connect time (README "Target checks"). SQLite cannot alter a
-- CHECK constraint, so the table is rebuilt with the same rows and ids.
CREATE TABLE attempts_new (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    delivery_id   INTEGER NOT NULL REFERENCES deliveries (id) ON DELETE CASCADE,
    started_at    INTEGER NOT NULL,
    duration_ms   INTEGER NOT NULL,
    status_code   INTEGER,
    error_class   TEXT CHECK (error_class IN ('timeout', 'connect', 'tls', 'forbidden_address', 'redirect', 'http')),
    error         TEXT,
    location      TEXT,      -- Location header of a 3xx
    response_body TEXT       -- at most 4 KiB of the response body
);
INSERT INTO attempts_new (id, delivery_id, started_at, duration_ms, status_code, error_class, error, location, response_body)
    SELECT id, delivery_id, started_at, duration_ms, status_code, error_class, error, location, response_body FROM attempts;
DROP TABLE attempts;
ALTER TABLE attempts_new RENAME TO attempts;
CREATE INDEX attempts_by_delivery ON attempts (delivery_id, id);

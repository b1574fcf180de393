-- Transactional outbox, delivery and attempt log, endpoint state (issue 3).
-- Times are INTEGER Unix milliseconds (UTC).

-- One row per (event, matching webhook endpoint), written in the same transaction as the event.
-- `service.synced` deliveries (full resync) have no event_id.
CREATE TABLE deliveries (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    webhook         TEXT    NOT NULL,
    event_id        INTEGER,
    namespace       TEXT    NOT NULL,
    name            TEXT    NOT NULL,
    kind            TEXT    NOT NULL CHECK (kind IN ('ADDED', 'MODIFIED', 'DELETED', 'SYNCED')),
    msg_id          TEXT    NOT NULL UNIQUE,   -- the webhook-id header: stable across retries
    payload         TEXT    NOT NULL,          -- the exact body bytes sent (and signed)
    state           TEXT    NOT NULL DEFAULT 'pending'
                    CHECK (state IN ('pending', 'succeeded', 'failed', 'superseded')),
    attempts        INTEGER NOT NULL DEFAULT 0,
    created_at      INTEGER NOT NULL,
    next_attempt_at INTEGER NOT NULL,
    claimed_until   INTEGER,                   -- lease of the attempt in flight, if any
    finished_at     INTEGER,
    last_status     INTEGER,
    last_error      TEXT
);
-- Per (endpoint, Service) queue: the head is the lowest pending id.
CREATE INDEX deliveries_queue ON deliveries (webhook, namespace, name, id) WHERE state = 'pending';
-- Claim order: pending deliveries of an endpoint by id.
CREATE INDEX deliveries_pending ON deliveries (webhook, id) WHERE state = 'pending';
CREATE INDEX deliveries_by_webhook ON deliveries (webhook, id);
CREATE INDEX deliveries_by_event ON deliveries (event_id);
CREATE INDEX deliveries_by_service ON deliveries (namespace, name, id);

CREATE TABLE attempts (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    delivery_id   INTEGER NOT NULL REFERENCES deliveries (id) ON DELETE CASCADE,
    started_at    INTEGER NOT NULL,
    duration_ms   INTEGER NOT NULL,
    status_code   INTEGER,
    error_class   TEXT CHECK (error_class IN ('timeout', 'connect', 'tls', 'redirect', 'http')),
    error         TEXT,
    location      TEXT,      -- Location header of a 3xx
    response_body TEXT       -- at most 4 KiB of the response body
);
CREATE INDEX attempts_by_delivery ON attempts (delivery_id, id);

-- Runtime state of endpoints: disabled by a 410 Gone from the receiver until re-enabled.
CREATE TABLE webhook_state (
    name            TEXT PRIMARY KEY NOT NULL,
    disabled_reason TEXT,
    disabled_at     INTEGER,
    disabled_url    TEXT      -- the URL that answered 410; a different configured URL re-enables
) WITHOUT ROWID;

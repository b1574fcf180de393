-- Event log, current state and watch bookkeeping (issue 2).
-- Times are INTEGER Unix milliseconds (UTC). Views are JSON documents of the normalized Service view
-- (src/model/view.rs, camelCase keys).

-- Append-only: rows are only ever inserted (and pruned by age, see database.event_retention).
-- AUTOINCREMENT: ids are never reused, even after pruning, so `id` is a safe resume cursor.
CREATE TABLE events (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    observed_at      INTEGER NOT NULL,
    type             TEXT    NOT NULL CHECK (type IN ('ADDED', 'MODIFIED', 'DELETED')),
    namespace        TEXT    NOT NULL,
    name             TEXT    NOT NULL,
    uid              TEXT    NOT NULL,
    resource_version TEXT    NOT NULL,
    cause            TEXT    NOT NULL CHECK (cause IN ('watch', 'relist', 'startup')),
    view             TEXT    NOT NULL,  -- after the change; the last view for DELETED
    previous         TEXT,              -- MODIFIED only: the view before
    changed          TEXT               -- MODIFIED only: JSON array of changed field names
);
CREATE INDEX events_by_service ON events (namespace, name, id);
CREATE INDEX events_by_time ON events (observed_at);

-- One row per in-scope Service.
CREATE TABLE services (
    namespace           TEXT    NOT NULL,
    name                TEXT    NOT NULL,
    uid                 TEXT    NOT NULL,
    resource_version    TEXT    NOT NULL,
    type                TEXT    NOT NULL,
    load_balancer_class TEXT,
    view                TEXT    NOT NULL,
    first_seen_at       INTEGER NOT NULL,
    updated_at          INTEGER NOT NULL,
    PRIMARY KEY (namespace, name)
) WITHOUT ROWID;

-- One row per watch scope: '*' (all namespaces) or a namespace name.
CREATE TABLE watch_progress (
    scope            TEXT    PRIMARY KEY NOT NULL,
    resource_version TEXT,               -- last resourceVersion seen on this scope
    last_list_at     INTEGER,            -- when the last full list was stored
    relist_count     INTEGER NOT NULL DEFAULT 0, -- full lists after the first one of each process start
    updated_at       INTEGER NOT NULL
) WITHOUT ROWID;

-- Pool members from Nodes and EndpointSlices (issue 10).

-- The members of each Service per backend mode, as last announced: JSON object keyed by mode
-- (`{"nodePort": {...}}`, the contract's `Backends`); NULL or `{}` when none are computed. A restart
-- recomputes them from the first lists and compares hashes, so an unchanged cluster records nothing.
ALTER TABLE services ADD COLUMN backends TEXT;

-- The Nodes, as far as they decide members (addresses, zone, eligibility; never readiness or
-- heartbeats): what `GET /api/v1/nodes` shows, and what a restart compares the first list with.
CREATE TABLE nodes (
    name             TEXT    PRIMARY KEY NOT NULL,
    uid              TEXT    NOT NULL,
    resource_version TEXT    NOT NULL,
    view             TEXT    NOT NULL,   -- JSON NodeView (src/model/backends/node.rs)
    updated_at       INTEGER NOT NULL
) WITHOUT ROWID;

-- One more event cause, `backends` (a member change coalesced from EndpointSlice and Node changes),
-- and the members in the log: the whole set for ADDED and DELETED, the diff per mode for a MODIFIED
-- whose members changed. SQLite cannot alter a CHECK constraint, so the table is rebuilt (same ids).
CREATE TABLE events_new (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    observed_at      INTEGER NOT NULL,
    type             TEXT    NOT NULL CHECK (type IN ('ADDED', 'MODIFIED', 'DELETED')),
    namespace        TEXT    NOT NULL,
    name             TEXT    NOT NULL,
    uid              TEXT    NOT NULL,
    resource_version TEXT    NOT NULL,
    cause            TEXT    NOT NULL
                     CHECK (cause IN ('watch', 'relist', 'startup', 'allocation', 'appliance', 'backends')),
    view             TEXT    NOT NULL,
    previous         TEXT,
    changed          TEXT,
    backends         TEXT,              -- ADDED / DELETED: JSON members per mode
    backends_diff    TEXT               -- MODIFIED with `backends` changed: JSON diff per mode
);
INSERT INTO events_new (id, observed_at, type, namespace, name, uid, resource_version, cause, view, previous, changed)
    SELECT id, observed_at, type, namespace, name, uid, resource_version, cause, view, previous, changed FROM events;
-- Ids are never reused (SSE resume and deliveries refer to them), even when retention pruned the newest
-- rows' predecessors: the new table continues the old table's sequence, not its highest remaining id.
INSERT INTO sqlite_sequence (name, seq)
    SELECT 'events_new', 0 WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'events_new');
UPDATE sqlite_sequence
    SET seq = MAX(seq, COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'events'), 0))
    WHERE name = 'events_new';
DROP TABLE events;
ALTER TABLE events_new RENAME TO events;
CREATE INDEX events_by_service ON events (namespace, name, id);
CREATE INDEX events_by_time ON events (observed_at);

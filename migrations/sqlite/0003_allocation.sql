-- Address allocation, status write-back and finalizers (issue 5).
-- Allocations live in the Service's view (`view.allocation`), so they commit with the event that
-- announces them; these columns and the table drive what vipwatch writes back to Kubernetes.

-- 1: the delivery waits until vipwatch's finalizer is on the Service (issue 5: "add the finalizer
-- before the first ADDED is delivered"). A held queue head blocks its queue, keeping order.
ALTER TABLE deliveries ADD COLUMN held INTEGER NOT NULL DEFAULT 0;
CREATE INDEX deliveries_held ON deliveries (namespace, name) WHERE held = 1 AND state = 'pending';

-- JSON `status.loadBalancer.ingress` list vipwatch must write back (it differs from what the Service
-- shows); NULL when the status is right or not vipwatch's to write.
ALTER TABLE services ADD COLUMN publish TEXT;
CREATE INDEX services_publish ON services (namespace, name) WHERE publish IS NOT NULL;

-- Work left after a DELETED of a Service that still exists (being deleted, or left scope): once every
-- subscribed endpoint acknowledged the DELETED, remove vipwatch's finalizer and clear the status
-- vipwatch published.
CREATE TABLE cleanups (
    event_id         INTEGER PRIMARY KEY NOT NULL, -- the DELETED event
    namespace        TEXT    NOT NULL,
    name             TEXT    NOT NULL,
    uid              TEXT    NOT NULL,
    remove_finalizer INTEGER NOT NULL,
    clear_ingress    TEXT,                         -- JSON ingress to clear if the Service still shows it
    created_at       INTEGER NOT NULL
);

-- Two more event causes: `allocation` (an address freed up for a pending Service) and `appliance`
-- (an endpoint with `assigns_vip` returned the Service's address). SQLite cannot alter a CHECK
-- constraint, so the table is rebuilt (same columns, ids and indexes).
CREATE TABLE events_new (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    observed_at      INTEGER NOT NULL,
    type             TEXT    NOT NULL CHECK (type IN ('ADDED', 'MODIFIED', 'DELETED')),
    namespace        TEXT    NOT NULL,
    name             TEXT    NOT NULL,
    uid              TEXT    NOT NULL,
    resource_version TEXT    NOT NULL,
    cause            TEXT    NOT NULL CHECK (cause IN ('watch', 'relist', 'startup', 'allocation', 'appliance')),
    view             TEXT    NOT NULL,
    previous         TEXT,
    changed          TEXT
);
INSERT INTO events_new SELECT * FROM events;
DROP TABLE events;
ALTER TABLE events_new RENAME TO events;
CREATE INDEX events_by_service ON events (namespace, name, id);
CREATE INDEX events_by_time ON events (observed_at);

-- Pool addresses of a DELETED Service stay reserved until every subscribed endpoint acknowledged the
-- DELETED, so the appliance is never asked to add a VIP it still serves for another Service.
CREATE TABLE releases (
    event_id   INTEGER PRIMARY KEY NOT NULL, -- the DELETED event
    namespace  TEXT    NOT NULL,
    name       TEXT    NOT NULL,
    uid        TEXT    NOT NULL,
    addresses  TEXT    NOT NULL,             -- JSON array of the addresses held
    created_at INTEGER NOT NULL
);

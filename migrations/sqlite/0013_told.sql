-- What each templated event-mode endpoint was last told about each Service and acknowledged: the
-- `service` value (JSON) of its last delivery of that Service that succeeded, which its templates see
-- as `told` to remove what a later view no longer has (src/store/told.rs). Written in the transaction
-- that records the successful attempt; an acknowledged DELETED removes the row. A table of its own:
-- pruning finished deliveries (`database.event_retention`) must not take it.
CREATE TABLE told (
    webhook     TEXT    NOT NULL,
    namespace   TEXT    NOT NULL,
    name        TEXT    NOT NULL,
    service     TEXT    NOT NULL,  -- JSON: the acknowledged payload's data.service
    delivery_id INTEGER NOT NULL,  -- the delivery that told it (pruning may have removed it since)
    told_at     INTEGER NOT NULL,  -- when its success was recorded (Unix ms)
    PRIMARY KEY (webhook, namespace, name)
);

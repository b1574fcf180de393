-- Deletions held by the mass-deletion guard (issue 12): Services one list would have deleted in bulk.
-- Their state row stays (VIPs stay allocated, nothing is relayed) until released through the API, or
-- confirmed by a later list `guard.confirm_after` after `held_at`, or until they reappear.
CREATE TABLE held_deletions (
    namespace TEXT    NOT NULL,
    name      TEXT    NOT NULL,
    uid       TEXT    NOT NULL,
    scope     TEXT    NOT NULL,                                    -- `*`, a namespace, or `startup` (not watched any more)
    cause     TEXT    NOT NULL CHECK (cause IN ('startup', 'relist')), -- of the DELETED once released
    reason    TEXT    NOT NULL,
    held_at   INTEGER NOT NULL,                                    -- Unix ms
    PRIMARY KEY (namespace, name)
) WITHOUT ROWID;

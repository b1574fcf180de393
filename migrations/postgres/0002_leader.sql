-- The leader lease (issue 14): one row; the replica in `holder` leads until `expires_at` (the
-- database's clock) unless it renews. `epoch` goes up by one at every change of holder and fences
-- the leader's writes: each write transaction first locks this row FOR SHARE where epoch, holder
-- and an unexpired lease still match, so a deposed leader commits nothing, and a takeover waits
-- for the old leader's transactions in flight.
CREATE TABLE leader (
    name       text        PRIMARY KEY,
    epoch      bigint      NOT NULL,
    holder     text        NOT NULL,
    elected_at timestamptz NOT NULL,
    renewed_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL
);

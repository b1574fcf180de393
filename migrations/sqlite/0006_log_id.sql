-- Facts about this database. `log_id`: the identity of the event log, a UUID made once, when the
-- database is created. Every delivery carries it (`data.log_id`), so a receiver compares event ids
-- only within one log: a replaced database starts its ids again at 1 under a new log_id.
CREATE TABLE meta (
    key   TEXT PRIMARY KEY NOT NULL,
    value TEXT NOT NULL
) WITHOUT ROWID;

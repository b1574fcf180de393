-- A queued MODIFIED that a newer change rewrites in place takes that change's event id and
-- `webhook-id`; a burst rewrites thousands of them. With an index on either column, PostgreSQL must
-- write the row's new version with an entry in each of the table's seven indexes; with neither, the
-- version stays on its page (a HOT update) and no index changes. Nothing looks a delivery up by its
-- `webhook-id`, whose uniqueness its UUIDv7 already gives; a lookup by event id also names the
-- Service, which `deliveries_by_service` serves. SQLite rewrites only the indexes of the columns an
-- update changes, so its schema keeps both.
DROP INDEX deliveries_by_event;
ALTER TABLE deliveries DROP CONSTRAINT deliveries_msg_id_key;

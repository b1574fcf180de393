-- Room on each page of `deliveries` for the row's next version: a claim and a lease's end change
-- only `claimed_until`, which no index holds, so with room on the page PostgreSQL updates the row in
-- place (a HOT update) instead of adding an entry to each of the table's indexes. Without it every
-- claim left a dead entry in `deliveries_ready` that the next claims walked over. Pages written from
-- now on keep the room; SQLite has no such setting.
ALTER TABLE deliveries SET (fillfactor = 70);

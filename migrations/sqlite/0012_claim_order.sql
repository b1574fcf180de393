-- The claim order is the due time (`next_attempt_at`), then the id (issue 13). A MODIFIED that
-- supersedes others takes the earliest place in line among them (src/store/outbox.rs,
-- INHERIT_PLACE), so a Service that keeps changing is not sent to the back of the line each time;
-- walking this index, a claim reads the due deliveries first and stops at the first one not due yet.
DROP INDEX deliveries_ready;
CREATE INDEX deliveries_ready ON deliveries (webhook, next_attempt_at, id) WHERE state = 'pending' AND held = 0;

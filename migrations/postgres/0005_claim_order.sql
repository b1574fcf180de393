-- The claim order is the due time, then the id. See migrations/sqlite/0012.
DROP INDEX deliveries_ready;
CREATE INDEX deliveries_ready ON deliveries (webhook, next_attempt_at, id) WHERE state = 'pending' AND held = 0;

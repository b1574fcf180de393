-- The claim order, narrowed to what a claim can take: pending deliveries of an endpoint by id that
-- are not held for the finalizer. See migrations/sqlite/0011.
DROP INDEX deliveries_pending;
CREATE INDEX deliveries_ready ON deliveries (webhook, id) WHERE state = 'pending' AND held = 0;

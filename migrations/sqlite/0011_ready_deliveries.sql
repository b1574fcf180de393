-- The claim order, narrowed to what a claim can take (issue 13): pending deliveries of an endpoint
-- by id that are not held for the finalizer. With every pending delivery in it, a claim during a
-- first list walked past thousands of held ones (reading each row to see `held`) before it found a
-- head it could send: 5.3 ms per claim, more than half the write connection's time in the initial
-- sync of 10,000 Services. The claim and the next-due query both ask for `held = 0`; letting a
-- delivery go (`held = 0`) adds it here.
DROP INDEX deliveries_pending;
CREATE INDEX deliveries_ready ON deliveries (webhook, id) WHERE state = 'pending' AND held = 0;

-- Every pool address a Service holds, one row each: the database itself refuses to give an address
-- to two Services, whatever a leader's allocator in memory believes (a bug, a deposed leader).
-- Written in the transaction that writes the Service's state row (see migrations/sqlite/0010).
CREATE TABLE vip_addresses (
    address   text NOT NULL PRIMARY KEY,
    namespace text NOT NULL,
    name      text NOT NULL
);
CREATE INDEX vip_addresses_by_service ON vip_addresses (namespace, name);
INSERT INTO vip_addresses (address, namespace, name)
    SELECT a.address, s.namespace, s.name
    FROM services s, jsonb_array_elements_text(s.view::jsonb -> 'allocation' -> 'addresses') AS a(address)
    WHERE s.view::jsonb -> 'allocation' ->> 'source' = 'pool'
    ON CONFLICT DO NOTHING;

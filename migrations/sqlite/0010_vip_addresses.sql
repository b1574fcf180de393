-- Every pool address a Service holds, one row each (issue 14): the database itself refuses to give
-- an address to two Services, whatever the allocator in memory believes (a bug, two leaders).
-- Written in the transaction that writes the Service's state row; filled from the state table here.
CREATE TABLE vip_addresses (
    address   TEXT NOT NULL PRIMARY KEY,
    namespace TEXT NOT NULL,
    name      TEXT NOT NULL
) WITHOUT ROWID;
CREATE INDEX vip_addresses_by_service ON vip_addresses (namespace, name);
INSERT OR IGNORE INTO vip_addresses (address, namespace, name)
    SELECT a.value, s.namespace, s.name FROM services s, json_each(s.view, '$.allocation.addresses') AS a
    WHERE json_extract(s.view, '$.allocation.source') = 'pool';

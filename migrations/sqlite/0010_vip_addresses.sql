-- Every pool address a Service holds, one row per port it serves there (issue 14): the database
-- itself refuses to give one address and port to two Services, whatever the allocator in memory
-- believes (a bug, two leaders). Services that share an address (`vipwatch.io/allow-shared-ip`)
-- hold different ports of it; a Service without ports holds port 0 of protocol ''. Written in the
-- transaction that writes the Service's state row; filled from the state table here.
CREATE TABLE vip_addresses (
    address   TEXT    NOT NULL,
    protocol  TEXT    NOT NULL,
    port      INTEGER NOT NULL,
    namespace TEXT    NOT NULL,
    name      TEXT    NOT NULL,
    PRIMARY KEY (address, protocol, port)
) WITHOUT ROWID;
CREATE INDEX vip_addresses_by_service ON vip_addresses (namespace, name);
INSERT OR IGNORE INTO vip_addresses (address, protocol, port, namespace, name)
    SELECT a.value, COALESCE(p.value->>'protocol', ''), COALESCE(p.value->>'port', 0), s.namespace, s.name
    FROM services s
    JOIN json_each(s.view, '$.allocation.addresses') AS a
    LEFT JOIN json_each(s.view, '$.ports') AS p
    WHERE json_extract(s.view, '$.allocation.source') = 'pool';

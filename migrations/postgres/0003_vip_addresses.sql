-- Every pool address a Service holds, one row per port it serves there: the database itself refuses
-- to give one address and port to two Services, whatever a leader's allocator in memory believes
-- (a bug, a deposed leader). See migrations/sqlite/0010.
CREATE TABLE vip_addresses (
    address   text   NOT NULL,
    protocol  text   NOT NULL,
    port      bigint NOT NULL,
    namespace text COLLATE "C" NOT NULL,
    name      text COLLATE "C" NOT NULL,
    PRIMARY KEY (address, protocol, port)
);
CREATE INDEX vip_addresses_by_service ON vip_addresses (namespace, name);
INSERT INTO vip_addresses (address, protocol, port, namespace, name)
    SELECT a.address, COALESCE(p.port ->> 'protocol', ''), COALESCE((p.port ->> 'port')::bigint, 0), s.namespace, s.name
    FROM services s
    CROSS JOIN LATERAL jsonb_array_elements_text(s.view::jsonb -> 'allocation' -> 'addresses') AS a(address)
    LEFT JOIN LATERAL jsonb_array_elements(s.view::jsonb -> 'ports') AS p(port) ON true
    WHERE s.view::jsonb -> 'allocation' ->> 'source' = 'pool'
    ON CONFLICT DO NOTHING;

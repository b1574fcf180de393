-- What each templated event-mode endpoint was last told about each Service and acknowledged. See
-- migrations/sqlite/0013.
CREATE TABLE told (
    webhook     text COLLATE "C" NOT NULL,
    namespace   text COLLATE "C" NOT NULL,
    name        text COLLATE "C" NOT NULL,
    service     text   NOT NULL,
    delivery_id bigint NOT NULL,
    told_at     bigint NOT NULL,
    PRIMARY KEY (webhook, namespace, name)
);

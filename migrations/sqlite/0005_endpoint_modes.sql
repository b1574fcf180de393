-- The backend mode each endpoint got by default (its `backend_mode`, else `[backends] mode`) when
-- vipwatch last started. A start with another mode for an endpoint resyncs that endpoint: its
-- receiver then holds every Service's members in the new mode (a per-Service annotation switch is a
-- MODIFIED with a diff instead; see src/relay/router.rs).
CREATE TABLE endpoint_modes (
    name TEXT PRIMARY KEY NOT NULL,   -- the [[webhooks]] name
    mode TEXT NOT NULL                -- nodePort, pod or none
) WITHOUT ROWID;

-- Versioned thread state's tables and row type.

-- The 2 KB state is written once per version (in thread_versions); the head row in threads
-- holds only the counter, the owner and the pruning bookkeeping, so its updates are small
-- and HOT (no indexed column changes).
CREATE TABLE replaysafe.threads (
    tenant_id     text NOT NULL,
    thread_id     text NOT NULL,
    -- The owner for good (also across delete); NULL: shared within the tenant.
    user_id       text,
    -- Current version: of the newest state, or of the tombstone when deleted.
    version       bigint NOT NULL CHECK (version >= 1),
    history_limit integer NOT NULL CHECK (history_limit >= 1),
    -- No thread_versions row below this version exists: pruning deletes the range
    -- [oldest_kept, new version - history_limit] and never scans what it deleted before.
    oldest_kept   bigint NOT NULL,
    deleted       boolean NOT NULL DEFAULT false,
    created_at    timestamptz NOT NULL,
    updated_at    timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, thread_id)
) WITH (fillfactor = 80);  -- room on the page for HOT updates of the head row

CREATE TABLE replaysafe.thread_versions (
    tenant_id  text NOT NULL,
    thread_id  text NOT NULL,
    version    bigint NOT NULL,
    state      jsonb NOT NULL,
    created_at timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, thread_id, version)
);

CREATE TYPE replaysafe.thread_record AS (
    version    bigint,
    state      jsonb,
    updated_at timestamptz
);

ALTER TABLE replaysafe.threads ENABLE ROW LEVEL SECURITY;
ALTER TABLE replaysafe.thread_versions ENABLE ROW LEVEL SECURITY;

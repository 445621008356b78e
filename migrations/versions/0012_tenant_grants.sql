-- Tenant grants (docs/isolation.md#tenant-grants): a signed grant is the capability of a
-- pooled login that serves many tenants. The function set that follows brings the functions
-- (every tenant-scoped one takes p_grant) and the views; this is what it cannot say.

-- What the installation names itself in a grant, and the database it was created in.
ALTER TABLE replaysafe.installation
    ADD COLUMN installation_id uuid NOT NULL DEFAULT gen_random_uuid(),
    ADD COLUMN database_oid oid;
UPDATE replaysafe.installation
SET database_oid = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database());
ALTER TABLE replaysafe.installation ALTER COLUMN database_oid SET NOT NULL;

-- The keys grants are signed with (the first is made by the first grant issued), the
-- tenants' revocation generations, and the users of LangGraph threads made under a grant
-- that names a user.
CREATE TABLE replaysafe.grant_keys (
    header     text PRIMARY KEY,
    key_id     text NOT NULL,
    issuer     text NOT NULL,
    inner_pad  bytea NOT NULL CHECK (length(inner_pad) = 64),
    outer_pad  bytea NOT NULL CHECK (length(outer_pad) = 64),
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE replaysafe.grant_generations (
    tenant_id  text PRIMARY KEY,
    generation bigint NOT NULL CHECK (generation > 0),
    revoked_at timestamptz NOT NULL
);
CREATE TABLE replaysafe.langgraph_thread_users (
    tenant_id text NOT NULL,
    thread_id text NOT NULL,
    user_id   text NOT NULL,
    PRIMARY KEY (tenant_id, thread_id)
);
ALTER TABLE replaysafe.grant_keys ENABLE ROW LEVEL SECURITY;
ALTER TABLE replaysafe.grant_generations ENABLE ROW LEVEL SECURITY;
ALTER TABLE replaysafe.langgraph_thread_users ENABLE ROW LEVEL SECURITY;

-- New signatures: p_grant last (sweep and purge also take p_tenant_id); the tenant check and
-- the time check take the grant.
DROP FUNCTION replaysafe._acts_for(text);
DROP FUNCTION replaysafe._check_now(timestamptz);
DROP FUNCTION replaysafe.claim_action(text, text, text, jsonb, text, interval, text, text,
                                      timestamptz, text);
DROP FUNCTION replaysafe._claim_locked(text, text, text, jsonb, text, interval, text, text,
                                       timestamptz, text);
DROP FUNCTION replaysafe.claim_actions(text, text[], text[], jsonb[], text, interval, text, text,
                                       timestamptz, text[]);
DROP FUNCTION replaysafe.heartbeat_action(text, text, integer, text, interval, timestamptz);
DROP FUNCTION replaysafe._report(text, text, integer, text, replaysafe.action_state, jsonb, jsonb,
                                 text, timestamptz);
DROP FUNCTION replaysafe.complete_action(text, text, integer, text, jsonb, text, timestamptz);
DROP FUNCTION replaysafe.fail_action(text, text, integer, text, jsonb, boolean, timestamptz);
DROP FUNCTION replaysafe.mark_action_unknown(text, text, integer, text, jsonb, timestamptz);
DROP FUNCTION replaysafe.resolve_action(text, text, text, jsonb, jsonb, text, text, timestamptz,
                                        integer);
DROP FUNCTION replaysafe.reopen_action(text, text, text, timestamptz);
DROP FUNCTION replaysafe.sweep_expired_actions(integer, timestamptz);
DROP FUNCTION replaysafe.purge_actions(interval, integer, timestamptz);
DROP FUNCTION replaysafe.read_thread(text, text, text);
DROP FUNCTION replaysafe.write_thread(text, text, bigint, jsonb, text, integer);
DROP FUNCTION replaysafe.thread_history(text, text, text, integer);
DROP FUNCTION replaysafe.delete_thread(text, text, text);
DROP FUNCTION replaysafe.langgraph_put(text, text, text, text, text, jsonb, jsonb, text[], text[],
                                       text[], bytea[], integer);
DROP FUNCTION replaysafe.langgraph_put_writes(text, text, text, text, text, text, integer[], text[],
                                              text[], bytea[], boolean);
DROP FUNCTION replaysafe.langgraph_get_tuple(text, text, text, text);
DROP FUNCTION replaysafe.langgraph_list(text, text, text, text, jsonb, text, integer);
DROP FUNCTION replaysafe.langgraph_delete_thread(text, text);
DROP FUNCTION replaysafe.langgraph_delete_for_runs(text, text[]);
DROP FUNCTION replaysafe.langgraph_copy_thread(text, text, text);
DROP FUNCTION replaysafe.langgraph_prune(text, text[], text);

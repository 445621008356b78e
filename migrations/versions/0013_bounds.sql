-- Size limits (an owner-only table the functions read) and roles that act for every tenant
-- only when bind_role_to_all_tenants() names them. The function set that follows brings the
-- checks, round-robin sweeps and purges across tenants, and acting_for().

CREATE TABLE replaysafe.all_tenant_roles (
    role_oid  oid PRIMARY KEY,
    role_name text NOT NULL,
    bound_at  timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE replaysafe.limits (
    id                       boolean PRIMARY KEY DEFAULT true CHECK (id),
    request_bytes            bigint NOT NULL DEFAULT 1048576 CHECK (request_bytes > 0),
    result_bytes             bigint NOT NULL DEFAULT 1048576 CHECK (result_bytes > 0),
    error_bytes              bigint NOT NULL DEFAULT 1048576 CHECK (error_bytes > 0),
    provider_reference_bytes bigint NOT NULL DEFAULT 1048576 CHECK (provider_reference_bytes > 0),
    thread_state_bytes       bigint NOT NULL DEFAULT 33554432 CHECK (thread_state_bytes > 0),
    checkpoint_bytes         bigint NOT NULL DEFAULT 33554432 CHECK (checkpoint_bytes > 0),
    blob_bytes               bigint NOT NULL DEFAULT 33554432 CHECK (blob_bytes > 0),
    pending_write_bytes      bigint NOT NULL DEFAULT 33554432 CHECK (pending_write_bytes > 0),
    number_digits            bigint NOT NULL DEFAULT 1000 CHECK (number_digits > 0),
    langgraph_key_bytes      bigint NOT NULL DEFAULT 2000 CHECK (langgraph_key_bytes > 0)
);
INSERT INTO replaysafe.limits DEFAULT VALUES;
ALTER TABLE replaysafe.all_tenant_roles ENABLE ROW LEVEL SECURITY;
ALTER TABLE replaysafe.limits ENABLE ROW LEVEL SECURITY;

-- Unbound members of replaysafe_auditor read every tenant until now; from here on they read
-- nothing. Named, with the way back (doctor names them too).
DO $lost$
DECLARE
    r record;
BEGIN
    -- Only an upgrade: an installation made in this transaction had no reader to lose.
    IF NOT EXISTS (SELECT 1 FROM replaysafe.installation i WHERE i.created_at < now()) THEN
        RETURN;
    END IF;
    FOR r IN
        WITH RECURSIVE members(roleid) AS (
            SELECT a.member FROM pg_catalog.pg_auth_members a
            WHERE a.roleid = pg_catalog.to_regrole('replaysafe_auditor')::oid
            UNION
            SELECT a.member FROM pg_catalog.pg_auth_members a JOIN members m ON a.roleid = m.roleid)
        SELECT o.rolname FROM members m JOIN pg_catalog.pg_roles o ON o.oid = m.roleid
        WHERE NOT EXISTS (SELECT 1 FROM replaysafe.role_bindings b WHERE b.role_oid = m.roleid)
          AND NOT pg_catalog.pg_has_role(m.roleid, (SELECT n.nspowner FROM pg_catalog.pg_namespace n
                                                    WHERE n.nspname = 'replaysafe'), 'MEMBER')
          AND o.rolname NOT IN ('replaysafe_worker', 'replaysafe_operator', 'replaysafe_issuer')
        ORDER BY o.rolname
    LOOP
        RAISE WARNING 'role % no longer reads every tenant (it is bound to none): to restore it, '
                      'SELECT replaysafe.bind_role_to_all_tenants(%)', r.rolname,
                      pg_catalog.quote_literal(r.rolname);
    END LOOP;
END
$lost$;

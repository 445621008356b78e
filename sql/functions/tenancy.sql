-- ---------------------------------------------------------------------------------------
-- Who is calling a function. Inside a SECURITY DEFINER function current_user is the owner,
-- so the functions read the caller from the session: the role set by SET ROLE, else the
-- login (session_user). A session's tenant is its current role's binding, else its
-- login's: SET ROLE to an unbound role (a group role, say) never widens what a bound login
-- may see or do.
-- ---------------------------------------------------------------------------------------
--
-- The views that answer who is calling are in sql/views/caller.sql.

-- Are we inside a security-restricted operation (an index expression, ANALYZE, REINDEX,
-- CLUSTER, REFRESH MATERIALIZED VIEW, autovacuum)? There the code that runs is the table
-- owner's, while the session's roles (what the functions read) are whoever runs the
-- maintenance: a superuser, autovacuum, or another tenant's login. The functions then act
-- for nobody (about 2.5 us a call, the price of knowing).
-- Postgres refuses DEALLOCATE there (42501) and says a statement does not exist elsewhere.
CREATE OR REPLACE FUNCTION replaysafe._in_restricted_operation()
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    DEALLOCATE replaysafe_probe_no_such_statement;  -- static: parsed once a session
    RETURN false;  -- only if someone prepared a statement of that name
EXCEPTION
    WHEN insufficient_privilege THEN RETURN true;
    WHEN invalid_sql_statement_name THEN RETURN false;
END
$$;

-- The session's binding: its current role's (SET ROLE), else its login's; NULL for an
-- unbound session. The hot functions' common case (a caller bound to p_tenant_id) reads it
-- here, with the restricted-operation probe beside it, rather than through _caller: two
-- calls cost less than a query of the view (docs/performance.md#tenant-grants). On Citus
-- sql/citus.sql replaces it (bindings per node).
CREATE OR REPLACE FUNCTION replaysafe._binding()
RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_tenant text;
BEGIN
    SELECT b.tenant_id INTO v_tenant FROM replaysafe.role_bindings b
    WHERE b.role_oid = to_regrole(quote_ident(CASE WHEN current_setting('role') = 'none'
                                                   THEN session_user::text
                                                   ELSE current_setting('role') END))::oid;
    IF NOT FOUND THEN
        SELECT b.tenant_id INTO v_tenant FROM replaysafe.role_bindings b
        WHERE b.role_oid = to_regrole(quote_ident(session_user::text))::oid;
    END IF;
    RETURN v_tenant;
END
$$;

-- RS004 unless the caller may act for p_tenant_id: its own tenant when bound; any tenant
-- for the unbound schema owner (see _caller_scope); nothing for anyone else. With a tenant
-- grant, what the grant allows in one of p_duties (_acts_with_grant, sql/functions/
-- tenant_grants.sql), and the grant's user is returned; otherwise NULL. p_report: a heartbeat
-- or report, which a grant that expired since the claim still authorises (see there).
CREATE OR REPLACE FUNCTION replaysafe._acts_for(p_tenant_id text, p_grant text DEFAULT NULL,
                                                p_duties text[] DEFAULT '{worker}',
                                                p_report boolean DEFAULT false)
RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_tenant text;
    v_role   text;
BEGIN
    IF p_grant IS NOT NULL THEN
        RETURN replaysafe._acts_with_grant(p_tenant_id, p_grant, p_duties, p_report) ->> 'sub';
    END IF;
    -- Every collatable argument of a PL/pgSQL call shares the collation of the call's
    -- arguments, and it wins over the columns' in every comparison in the function: a
    -- caller's nondeterministic collation (a case-insensitive one in pg_temp, say) on any
    -- argument made 'acme' equal 'ACME' here and in every key lookup after it. The name
    -- pg_collation_for gives is text in that collation too: compared under its own, an
    -- attacker's collation named _."default" (punctuation ignored) would equal '"default"':
    -- both comparisons here are under "C".
    IF pg_collation_for(p_tenant_id) COLLATE "C" IS DISTINCT FROM '"default"' THEN
        PERFORM replaysafe._invalid('p_tenant_id', 'the arguments must not carry a COLLATE clause '
                                    '(comparisons use the database''s collation)');
    END IF;
    SELECT c.tenant_id, c.role_name INTO v_tenant, v_role FROM replaysafe._caller c;
    IF v_tenant = p_tenant_id COLLATE "C" THEN
        RETURN NULL;
    END IF;
    IF v_tenant IS NULL THEN
        -- The schema owner itself, the common unbound caller, without _caller_scope's
        -- membership walk (~40 us); in a security-restricted operation nobody is the owner.
        IF to_regrole(quote_ident(v_role))::oid
               = (SELECT n.nspowner FROM pg_namespace n WHERE n.nspname = 'replaysafe')
           AND NOT replaysafe._in_restricted_operation() THEN
            RETURN NULL;
        END IF;
        IF EXISTS (SELECT 1 FROM replaysafe._caller_scope s WHERE s.acts_for_all) THEN
            RETURN NULL;
        END IF;
    END IF;
    PERFORM replaysafe._raise('RS004', 'access denied: this role may not act for that tenant');
    RETURN NULL;
END
$$;

-- ---------------------------------------------------------------------------------------
-- Tenant bindings (schema owner only)
-- ---------------------------------------------------------------------------------------

-- The checks both bindings make, and the OID of the role to bind: the caller is the schema
-- owner, p_role an existing role that is not a group role.
CREATE OR REPLACE FUNCTION replaysafe._role_to_bind(p_role text)
RETURNS oid
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_oid oid;
BEGIN
    -- EXECUTE is the owner's alone; a default privilege granted by mistake must not open it.
    IF NOT EXISTS (SELECT 1 FROM replaysafe._caller_scope c WHERE c.is_owner) THEN
        PERFORM replaysafe._raise('RS004', 'access denied: only the schema owner binds roles');
    END IF;
    SELECT r.oid INTO v_oid FROM pg_roles r WHERE r.rolname = p_role;
    IF p_role IS NULL OR v_oid IS NULL THEN
        PERFORM replaysafe._invalid('p_role', 'must name an existing role');
    END IF;
    -- Bound, a group role would hand its tenant to every member that SETs ROLE to it.
    IF p_role IN ('replaysafe_worker', 'replaysafe_operator', 'replaysafe_auditor',
                  'replaysafe_issuer') THEN
        PERFORM replaysafe._invalid('p_role', 'must not be one of the group roles (bind their members)');
    END IF;
    RETURN v_oid;
END
$$;

CREATE OR REPLACE FUNCTION replaysafe.bind_role_to_tenant(p_role text, p_tenant_id text)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_oid oid := replaysafe._role_to_bind(p_role);
BEGIN
    PERFORM replaysafe._check_id('p_tenant_id', p_tenant_id);
    DELETE FROM replaysafe.all_tenant_roles a WHERE a.role_oid = v_oid;
    INSERT INTO replaysafe.role_bindings AS b (role_oid, role_name, tenant_id)
    VALUES (v_oid, p_role, p_tenant_id)
    ON CONFLICT (role_oid) DO UPDATE
    SET role_name = excluded.role_name, tenant_id = excluded.tenant_id, bound_at = now();
END
$$;

CREATE OR REPLACE FUNCTION replaysafe.unbind_role(p_role text)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_found boolean;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM replaysafe._caller_scope c WHERE c.is_owner) THEN
        PERFORM replaysafe._raise('RS004', 'access denied: only the schema owner binds roles');
    END IF;
    IF p_role IS NULL THEN
        PERFORM replaysafe._invalid('p_role', 'must not be NULL');
    END IF;
    -- The role's binding; or, for a name no role has any more, the binding left behind.
    DELETE FROM replaysafe.role_bindings b
    WHERE b.role_oid = (SELECT r.oid FROM pg_roles r WHERE r.rolname = p_role)
       OR (b.role_name = p_role AND NOT EXISTS (SELECT 1 FROM pg_roles r WHERE r.oid = b.role_oid));
    v_found := FOUND;
    DELETE FROM replaysafe.all_tenant_roles a
    WHERE a.role_oid = (SELECT r.oid FROM pg_roles r WHERE r.rolname = p_role)
       OR (a.role_name = p_role AND NOT EXISTS (SELECT 1 FROM pg_roles r WHERE r.oid = a.role_oid));
    RETURN v_found OR FOUND;
END
$$;

-- Lets a role act for every tenant of this installation within its duties (its group roles):
-- an auditor that reads every tenant, a central reconciler that is an operator. Nobody else
-- does, but the schema owner: an unbound role sees and changes nothing, whatever its groups.
-- A tenant binding of the session's current role or of its login still wins (SET ROLE to an
-- all-tenant role never widens a bound login); binding to a tenant again removes this.
CREATE OR REPLACE FUNCTION replaysafe.bind_role_to_all_tenants(p_role text)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_oid oid := replaysafe._role_to_bind(p_role);
BEGIN
    -- An issuer signs grants for any tenant: acting for every tenant as well would make one
    -- login both the capability's maker and its holder (doctor flags it too).
    IF pg_has_role(v_oid, coalesce(to_regrole('replaysafe_issuer')::oid, 0::oid), 'MEMBER') THEN
        PERFORM replaysafe._invalid('p_role', 'must not be a member of replaysafe_issuer');
    END IF;
    IF pg_has_role(v_oid, (SELECT n.nspowner FROM pg_namespace n WHERE n.nspname = 'replaysafe'),
                   'MEMBER') THEN
        PERFORM replaysafe._invalid('p_role', 'must not be the schema owner or one of its members '
                                    '(the owner acts for every tenant already)');
    END IF;
    DELETE FROM replaysafe.role_bindings b WHERE b.role_oid = v_oid;
    INSERT INTO replaysafe.all_tenant_roles AS a (role_oid, role_name)
    VALUES (v_oid, p_role)
    ON CONFLICT (role_oid) DO UPDATE SET role_name = excluded.role_name, bound_at = now();
END
$$;

-- ---------------------------------------------------------------------------------------
-- The installed revision, for every replaysafe role (doctor, `migrate current`). The
-- version table is alembic's; without it (this script run by hand) the answer is NULL.
-- ---------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION replaysafe.installed_revision() RETURNS text
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    -- One row on a linear chain; the version table is created by alembic, not by this
    -- script, so the name is resolved at call time.
    RETURN (SELECT pg_catalog.string_agg(v.version_num::text, ' ' ORDER BY v.version_num)
            FROM replaysafe.alembic_version v);
EXCEPTION WHEN undefined_table THEN
    RETURN NULL;
END
$$;

-- What the caller acts for: its role, its tenant (its binding, or p_grant's tenant when the
-- grant is valid for it) or every tenant (the schema owner, bind_role_to_all_tenants());
-- neither for a role that acts for no tenant, which every function refuses and every view
-- shows nothing to. Tools ask before they report "nothing to do" (the command line,
-- reconcile). It names no other tenant and no other role's binding.
CREATE OR REPLACE FUNCTION replaysafe.acting_for(p_grant text DEFAULT NULL,
                                                 OUT role_name text, OUT tenant_id text,
                                                 OUT all_tenants boolean)
RETURNS record
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    SELECT c.role_name, c.tenant_id, c.acts_for_all INTO role_name, tenant_id, all_tenants
    FROM replaysafe._caller_scope c;
    IF p_grant IS NOT NULL THEN
        tenant_id := replaysafe._acts_with_grant(NULL, p_grant, '{worker,operator,auditor}') ->> 'tid';
        all_tenants := false;
    END IF;
END
$$;

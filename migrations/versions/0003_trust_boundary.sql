-- Revision 0003: the trust boundary (docs/isolation.md). The functions become the only way
-- in: SECURITY DEFINER, owned by the schema owner, search_path pinned to pg_catalog,
-- pg_temp; no group role keeps any privilege on a table or a private helper; the views
-- become owner-rights security_barrier views that filter by the caller's tenant; a new
-- replaysafe_operator role settles, reopens and purges; an installation secret salts the
-- idempotency keys of new actions (existing actions keep theirs); time and id bounds.
-- Data is kept: only the functions, views, policies and grants are replaced.

-- Every name below is resolved in pg_catalog first, for the rest of this transaction.
SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);

DO $roles$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = current_user
               AND (rolsuper OR rolcreaterole)) THEN
        BEGIN
            IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'replaysafe_operator') THEN
                CREATE ROLE replaysafe_operator NOLOGIN;
            END IF;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
        END;
    END IF;
END
$roles$;

-- The 0001/0002 interface goes: views, row-level security policies, every function
-- (recreated below), and every privilege a group role held on a table.
DROP VIEW replaysafe.actions_v, replaysafe.action_attempts_v, replaysafe.unresolved_actions,
    replaysafe.multi_effect_actions, replaysafe.threads_v;
DO $drop$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT p.policyname, p.tablename FROM pg_catalog.pg_policies p
             WHERE p.schemaname = 'replaysafe' LOOP
        EXECUTE pg_catalog.format('DROP POLICY %I ON replaysafe.%I', r.policyname, r.tablename);
    END LOOP;
    FOR r IN SELECT p.oid::pg_catalog.regprocedure AS f FROM pg_catalog.pg_proc p
             JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
             WHERE n.nspname = 'replaysafe' LOOP
        EXECUTE 'DROP FUNCTION ' || r.f::text;
    END LOOP;
    FOR r IN SELECT rolname FROM pg_catalog.pg_roles
             WHERE rolname IN ('replaysafe_worker', 'replaysafe_auditor') LOOP
        EXECUTE pg_catalog.format('REVOKE ALL ON ALL TABLES IN SCHEMA replaysafe FROM %I', r.rolname);
    END LOOP;
END
$drop$;

-- Bindings by role OID (a renamed role keeps its tenant; a dropped and re-created one gets
-- none). Bindings of roles that no longer exist go.
ALTER TABLE replaysafe.role_bindings ADD COLUMN role_oid oid;
UPDATE replaysafe.role_bindings b SET role_oid = r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = b.role_name;
DELETE FROM replaysafe.role_bindings WHERE role_oid IS NULL;
ALTER TABLE replaysafe.role_bindings ALTER COLUMN role_oid SET NOT NULL,
    DROP CONSTRAINT role_bindings_pkey, ADD CONSTRAINT role_bindings_pkey PRIMARY KEY (role_oid);

-- The installation's secret: it salts the derived idempotency keys (and so the wake-up
-- payloads), so nobody who lacks it can confirm a guessed (tenant, key) pair.
CREATE TABLE replaysafe.installation (
    id         boolean PRIMARY KEY DEFAULT true CHECK (id),
    key_secret bytea NOT NULL CHECK (length(key_secret) >= 16),
    created_at timestamptz NOT NULL DEFAULT now()
);
-- 244 random bits from the server's strong random source (no extension needed).
INSERT INTO replaysafe.installation (key_secret)
VALUES (decode(replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''), 'hex'));

-- ---------------------------------------------------------------------------------------
-- Who is calling a function. Inside a SECURITY DEFINER function current_user is the owner,
-- so the functions read the caller from the session: the role set by SET ROLE, else the
-- login (session_user). A session's tenant is its current role's binding, else its
-- login's: SET ROLE to an unbound role (a group role, say) never widens what a bound login
-- may see or do.
-- ---------------------------------------------------------------------------------------

-- Are we inside a security-restricted operation (an index expression, ANALYZE, REINDEX,
-- CLUSTER, REFRESH MATERIALIZED VIEW, autovacuum)? There the code that runs is the table
-- owner's, while the session's roles (what the functions read) are whoever runs the
-- maintenance: a superuser, autovacuum, or another tenant's login. The functions then act
-- for nobody (about 2.5 us a call, the price of knowing).
-- Postgres refuses DEALLOCATE there (42501) and says a statement does not exist elsewhere.
CREATE FUNCTION replaysafe._in_restricted_operation()
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    EXECUTE 'DEALLOCATE replaysafe_probe_no_such_statement';
    RETURN false;  -- only if someone prepared a statement of that name
EXCEPTION
    WHEN insufficient_privilege THEN RETURN true;
    WHEN invalid_sql_statement_name THEN RETURN false;
END
$$;

CREATE VIEW replaysafe._caller AS
SELECT r.role_name,
       CASE WHEN replaysafe._in_restricted_operation() THEN NULL  -- see the function
            -- to_regrole: a syscache probe (pg_roles is a view that costs ~6 us to join)
            ELSE coalesce(
                (SELECT b.tenant_id FROM replaysafe.role_bindings b
                 WHERE b.role_oid = to_regrole(quote_ident(r.role_name))::oid),
                (SELECT b.tenant_id FROM replaysafe.role_bindings b
                 WHERE b.role_oid = to_regrole(quote_ident(r.login_name))::oid)) END
           AS tenant_id
FROM (SELECT CASE WHEN current_setting('role') = 'none' THEN session_user::text
                  ELSE current_setting('role') END AS role_name,
             session_user::text AS login_name) r;

-- ---------------------------------------------------------------------------------------
-- Private helpers (SECURITY INVOKER: only the definer functions, running as the owner,
-- may call them)
-- ---------------------------------------------------------------------------------------

CREATE FUNCTION replaysafe._raise(p_sqlstate text, p_message text, p_detail text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_detail IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = p_sqlstate, MESSAGE = p_message;
    END IF;
    RAISE EXCEPTION USING ERRCODE = p_sqlstate, MESSAGE = p_message, DETAIL = p_detail;
END
$$;

CREATE FUNCTION replaysafe._invalid(p_name text, p_rule text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM replaysafe._raise('RS005', format('invalid argument %s: %s', p_name, p_rule));
END
$$;

-- Every id (tenant, action key, thread, user, worker, operation, claim token): non-empty
-- text of at most 512 characters and 1,024 bytes. The public functions test the valid case
-- inline (no call) and call this only to name the offending argument.
CREATE FUNCTION replaysafe._check_id(p_name text, p_value text, p_nullable boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_value IS NULL AND p_nullable THEN
        RETURN;
    END IF;
    IF p_value IS NULL OR length(p_value) NOT BETWEEN 1 AND 512 OR octet_length(p_value) > 1024 THEN
        PERFORM replaysafe._invalid(p_name, format(
            'must be non-empty text of at most 512 characters and 1024 bytes (got %s)',
            CASE WHEN p_value IS NULL THEN 'NULL'
                 ELSE length(p_value) || ' characters, ' || octet_length(p_value) || ' bytes' END));
    END IF;
END
$$;

-- The caller's wider rights, for the functions (never needed on a bound caller's hot path).
-- It is the owner when it is the schema owner or an explicit member of it (pg_auth_members:
-- unlike pg_has_role(), a superuser is not a member of every role, so an unbound superuser
-- that is not the schema owner acts for no tenant), and not inside a security-restricted
-- operation; unbound, the owner acts for every tenant; the owner and replaysafe_operator
-- members may pass a p_now far from the clock. (No parameters, no pg_roles: one cached plan,
-- syscache probes.)
CREATE VIEW replaysafe._caller_scope AS
WITH RECURSIVE
    owners(roleid) AS (
        SELECT n.nspowner FROM pg_namespace n WHERE n.nspname = 'replaysafe'
        UNION
        SELECT a.member FROM pg_auth_members a JOIN owners o ON a.roleid = o.roleid),
    operators(roleid) AS (
        SELECT to_regrole('replaysafe_operator')::oid
        UNION
        SELECT a.member FROM pg_auth_members a JOIN operators o ON a.roleid = o.roleid),
    me AS (
        SELECT c.role_name, c.tenant_id, to_regrole(quote_ident(c.role_name))::oid AS role_oid,
               replaysafe._in_restricted_operation() AS restricted
        FROM replaysafe._caller c)
SELECT me.role_name, me.tenant_id, s.is_owner,
       me.tenant_id IS NULL AND s.is_owner AS acts_for_all,
       s.is_owner OR (NOT me.restricted AND me.role_oid IN (SELECT o.roleid FROM operators o))
           AS owner_or_operator
FROM me
CROSS JOIN LATERAL (SELECT NOT me.restricted AND me.role_oid IN (SELECT o.roleid FROM owners o)
                        AS is_owner) s;

-- Who is reading a view: a view does not switch user, so current_user is the reader (in a
-- security-restricted operation, the code's owner, not the session's login). Its tenant is
-- its binding, else its login's; unbound, it reads every tenant when it is a member of the
-- schema owner or of replaysafe_auditor. (Pure SQL: a view may call no private helper.)
CREATE VIEW replaysafe._reader AS
SELECT r.tenant_id,
       CASE WHEN r.tenant_id IS NOT NULL THEN false
            -- A group role itself never reads every tenant: code a tenant made it own (after
            -- SET ROLE) may run in anyone's session.
            WHEN current_user IN ('replaysafe_worker', 'replaysafe_operator', 'replaysafe_auditor')
                THEN false
            ELSE pg_has_role(current_user, n.nspowner, 'USAGE')
                 OR EXISTS (SELECT 1 FROM pg_roles a WHERE a.rolname = 'replaysafe_auditor'
                            AND pg_has_role(current_user, a.oid, 'USAGE')) END AS reads_all
FROM (SELECT coalesce(
          (SELECT b.tenant_id FROM replaysafe.role_bindings b
           WHERE b.role_oid = to_regrole(quote_ident(current_user))::oid),
          -- The login's binding only when current_user is the session's own current role
          -- (SET ROLE never widens): not for code of another owner running in this session
          -- (an index expression analyzed here, a definer function).
          (SELECT b.tenant_id FROM replaysafe.role_bindings b
           WHERE b.role_oid = to_regrole(quote_ident(session_user))::oid
             AND current_user::text = CASE WHEN current_setting('role') = 'none'
                                           THEN session_user::text
                                           ELSE current_setting('role') END))
          AS tenant_id) r,
     pg_namespace n
WHERE n.nspname = 'replaysafe';

-- Slow path of the time checks: p_now is NULL, not finite, outside the years a client can
-- represent, in the future, or more than 5 minutes before the database clock. Returns the
-- time the call uses. Only the schema owner and replaysafe_operator members may move time:
-- from anyone else a time more than 5 minutes away is refused, and a time in the future
-- (within those 5 minutes: client clocks drift) is taken as the clock, so a worker can never
-- expire or re-claim another caller's lease early.
CREATE FUNCTION replaysafe._check_now(p_now timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_clock timestamptz := clock_timestamp();
BEGIN
    IF p_now IS NULL THEN
        PERFORM replaysafe._invalid('p_now', 'must not be NULL (omit it for the database clock)');
    END IF;
    IF NOT (p_now >= timestamptz '1900-01-01 00:00+00' AND p_now < timestamptz '9999-01-01 00:00+00') THEN
        PERFORM replaysafe._invalid('p_now', format(
            'must be a finite time between the years 1900 and 9999 (got %s)', p_now));
    END IF;
    IF p_now <= v_clock AND p_now >= v_clock - interval '5 minutes' THEN
        RETURN p_now;
    END IF;
    IF EXISTS (SELECT 1 FROM replaysafe._caller_scope c WHERE c.owner_or_operator) THEN
        RETURN p_now;
    END IF;
    IF p_now BETWEEN v_clock - interval '5 minutes' AND v_clock + interval '5 minutes' THEN
        RETURN v_clock;
    END IF;
    PERFORM replaysafe._invalid('p_now',
        'must lie within 5 minutes of the database clock (only the schema owner and '
        'replaysafe_operator members may pass another time)');
    RETURN NULL;
END
$$;

-- RS004 unless the caller may act for p_tenant_id: its own tenant when bound; any tenant
-- for the unbound schema owner (see _caller_scope); nothing for anyone else.
CREATE FUNCTION replaysafe._acts_for(p_tenant_id text)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_tenant text;
    v_role   text;
BEGIN
    SELECT c.tenant_id, c.role_name INTO v_tenant, v_role FROM replaysafe._caller c;
    IF v_tenant = p_tenant_id THEN
        RETURN;
    END IF;
    IF v_tenant IS NULL THEN
        -- The schema owner itself, the common unbound caller, without _caller_scope's
        -- membership walk (~40 us); in a security-restricted operation nobody is the owner.
        IF to_regrole(quote_ident(v_role))::oid
               = (SELECT n.nspowner FROM pg_namespace n WHERE n.nspname = 'replaysafe')
           AND NOT replaysafe._in_restricted_operation() THEN
            RETURN;
        END IF;
        IF EXISTS (SELECT 1 FROM replaysafe._caller_scope s WHERE s.acts_for_all) THEN
            RETURN;
        END IF;
    END IF;
    PERFORM replaysafe._raise('RS004', 'access denied: this role may not act for that tenant');
END
$$;

-- The derived idempotency key: fixed length (68 characters), salted with the installation's
-- secret (nested hash, so no length extension), the tenant length-prefixed so no two
-- (tenant, key) pairs collide by concatenation. Owner only: the key reaches a caller only in
-- the answer to its own claim.
CREATE FUNCTION replaysafe.idempotency_key(p_tenant_id text, p_action_key text)
RETURNS text
LANGUAGE sql STABLE STRICT
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT 'rs2_' || encode(sha256(i.key_secret || sha256(i.key_secret || convert_to(
        length(p_tenant_id)::text || ':' || p_tenant_id || p_action_key, 'UTF8'))), 'hex')
    FROM replaysafe.installation i
$$;

-- ---------------------------------------------------------------------------------------
-- Tenant bindings (schema owner only)
-- ---------------------------------------------------------------------------------------

CREATE FUNCTION replaysafe.bind_role_to_tenant(p_role text, p_tenant_id text)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- EXECUTE is the owner's alone; a default privilege granted by mistake must not open it.
    IF NOT EXISTS (SELECT 1 FROM replaysafe._caller_scope c WHERE c.is_owner) THEN
        PERFORM replaysafe._raise('RS004', 'access denied: only the schema owner binds roles');
    END IF;
    IF p_role IS NULL OR NOT EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = p_role) THEN
        PERFORM replaysafe._invalid('p_role', 'must name an existing role');
    END IF;
    -- Bound, a group role would hand its tenant to every member that SETs ROLE to it.
    IF p_role IN ('replaysafe_worker', 'replaysafe_operator', 'replaysafe_auditor') THEN
        PERFORM replaysafe._invalid('p_role', 'must not be one of the group roles (bind their members)');
    END IF;
    PERFORM replaysafe._check_id('p_tenant_id', p_tenant_id);
    INSERT INTO replaysafe.role_bindings AS b (role_oid, role_name, tenant_id)
    SELECT r.oid, p_role, p_tenant_id FROM pg_roles r WHERE r.rolname = p_role
    ON CONFLICT (role_oid) DO UPDATE
    SET role_name = excluded.role_name, tenant_id = excluded.tenant_id, bound_at = now();
END
$$;

CREATE FUNCTION replaysafe.unbind_role(p_role text)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
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
    RETURN FOUND;
END
$$;

-- ---------------------------------------------------------------------------------------
-- The action ledger
-- ---------------------------------------------------------------------------------------

-- Claim an action: create it, or find it and answer what the caller must do.
-- Outcomes: claimed | replay | running | unknown; RS001 on a changed fingerprint.
-- A replay or an "unknown" answer reads one row without locking and writes nothing.
CREATE FUNCTION replaysafe.claim_action(
    p_tenant_id   text,
    p_action_key  text,
    p_operation   text,
    p_request     jsonb,
    p_worker_id   text,
    p_lease       interval    DEFAULT '30 seconds',
    p_thread_id   text        DEFAULT NULL,
    p_on_expired  text        DEFAULT 'unknown',
    p_now         timestamptz DEFAULT clock_timestamp())
RETURNS replaysafe.claim_record
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    a        replaysafe.actions;
    v_found  boolean;
    v_secret bytea;
BEGIN
    IF (octet_length(p_tenant_id) BETWEEN 1 AND 1024 AND length(p_tenant_id) <= 512
        AND octet_length(p_action_key) BETWEEN 1 AND 1024 AND length(p_action_key) <= 512
        AND octet_length(p_operation) BETWEEN 1 AND 1024 AND length(p_operation) <= 512
        AND octet_length(p_worker_id) BETWEEN 1 AND 1024 AND length(p_worker_id) <= 512
        AND (p_thread_id IS NULL
             OR (octet_length(p_thread_id) BETWEEN 1 AND 1024 AND length(p_thread_id) <= 512)))
       IS NOT TRUE THEN
        PERFORM replaysafe._check_id('p_tenant_id', p_tenant_id);
        PERFORM replaysafe._check_id('p_action_key', p_action_key);
        PERFORM replaysafe._check_id('p_operation', p_operation);
        PERFORM replaysafe._check_id('p_worker_id', p_worker_id);
        PERFORM replaysafe._check_id('p_thread_id', p_thread_id, true);
    END IF;
    IF p_request IS NULL OR jsonb_typeof(p_request) <> 'object' THEN
        PERFORM replaysafe._invalid('p_request', 'must be a JSON object');
    END IF;
    -- No month part: '1 month -23 days' compares as 7 days but lasts 8 in a 31-day month.
    IF p_lease IS NULL OR p_lease <= interval '0' OR p_lease > interval '7 days'
       OR date_part('month', p_lease) <> 0 OR date_part('year', p_lease) <> 0 THEN
        PERFORM replaysafe._invalid('p_lease', 'must be a positive interval of at most 7 days');
    END IF;
    IF p_on_expired IS NULL OR p_on_expired NOT IN ('unknown', 'reclaim') THEN
        PERFORM replaysafe._invalid('p_on_expired', 'must be ''unknown'' or ''reclaim''');
    END IF;
    IF (p_now BETWEEN clock_timestamp() - interval '5 minutes' AND clock_timestamp()) IS NOT TRUE THEN
        p_now := replaysafe._check_now(p_now);
    END IF;
    PERFORM replaysafe._acts_for(p_tenant_id);

    -- Fast path, no lock: terminal and unknown actions answer from one read.
    SELECT * INTO a FROM replaysafe.actions x
    WHERE x.tenant_id = p_tenant_id AND x.action_key = p_action_key;
    v_found := FOUND;

    IF v_found THEN
        IF a.operation <> p_operation OR a.request <> p_request THEN
            PERFORM replaysafe._raise('RS001', format(
                'action %s already exists with a different operation or request', p_action_key));
        END IF;
        IF a.state IN ('succeeded', 'failed') THEN
            RETURN ('replay', a.state, a.attempt, a.lease_expires_at, a.result, a.error,
                a.idempotency_key, a.provider_reference)::replaysafe.claim_record;
        ELSIF a.state = 'unknown' THEN
            RETURN ('unknown', a.state, a.attempt, a.lease_expires_at, a.result, a.error,
                a.idempotency_key, a.provider_reference)::replaysafe.claim_record;
        ELSIF a.state = 'running' AND a.lease_expires_at > p_now AND a.has_waiters THEN
            RETURN ('running', a.state, a.attempt, a.lease_expires_at, a.result, a.error,
                a.idempotency_key, a.provider_reference)::replaysafe.claim_record;
        END IF;
    ELSE
        -- The key of replaysafe.idempotency_key(), computed here: a query without parameters
        -- keeps one cached plan (with them, every call would be planned anew: ~8 us).
        SELECT i.key_secret INTO v_secret FROM replaysafe.installation i;
        a.idempotency_key := 'rs2_' || encode(sha256(v_secret || sha256(v_secret || convert_to(
            length(p_tenant_id)::text || ':' || p_tenant_id || p_action_key, 'UTF8'))), 'hex');
        INSERT INTO replaysafe.actions AS x (
            tenant_id, action_key, thread_id, operation, request, state, attempt, on_expired,
            idempotency_key, worker_id, lease_expires_at, created_at, updated_at)
        VALUES (
            p_tenant_id, p_action_key, p_thread_id, p_operation, p_request, 'running', 1,
            p_on_expired, a.idempotency_key, p_worker_id,
            p_now + p_lease, p_now, p_now)
        ON CONFLICT DO NOTHING
        -- Only what the answer needs (the rest is NULL): a whole row costs a copy.
        RETURNING x.state, x.attempt, x.lease_expires_at, x.idempotency_key
        INTO a.state, a.attempt, a.lease_expires_at, a.idempotency_key;
        IF FOUND THEN
            INSERT INTO replaysafe.action_attempts (tenant_id, action_key, attempt, worker_id, claimed_at)
            VALUES (p_tenant_id, p_action_key, 1, p_worker_id, p_now);
            RETURN ('claimed', a.state, a.attempt, a.lease_expires_at, a.result, a.error,
                a.idempotency_key, a.provider_reference)::replaysafe.claim_record;
        END IF;
        -- A concurrent claim created it first: decide under its row lock below.
    END IF;

    RETURN replaysafe._claim_locked(p_tenant_id, p_action_key, p_operation, p_request,
                                    p_worker_id, p_lease, p_thread_id, p_on_expired, p_now);
END
$$;

-- The part of a claim that must change the row: waiters, expired leases, retries.
CREATE FUNCTION replaysafe._claim_locked(
    p_tenant_id text, p_action_key text, p_operation text, p_request jsonb,
    p_worker_id text, p_lease interval, p_thread_id text, p_on_expired text, p_now timestamptz)
RETURNS replaysafe.claim_record
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    a replaysafe.actions;
BEGIN
    SELECT * INTO a FROM replaysafe.actions x
    WHERE x.tenant_id = p_tenant_id AND x.action_key = p_action_key
    FOR UPDATE;
    IF NOT FOUND THEN
        -- Purged between our reads (it was terminal): it is new again.
        RETURN replaysafe.claim_action(p_tenant_id, p_action_key, p_operation, p_request,
                                       p_worker_id, p_lease, p_thread_id, p_on_expired, p_now);
    END IF;
    IF a.operation <> p_operation OR a.request <> p_request THEN
        PERFORM replaysafe._raise('RS001', format(
            'action %s already exists with a different operation or request', p_action_key));
    END IF;

    IF a.state IN ('succeeded', 'failed') THEN
        RETURN ('replay', a.state, a.attempt, a.lease_expires_at, a.result, a.error,
                a.idempotency_key, a.provider_reference)::replaysafe.claim_record;
    ELSIF a.state = 'unknown' THEN
        RETURN ('unknown', a.state, a.attempt, a.lease_expires_at, a.result, a.error,
                a.idempotency_key, a.provider_reference)::replaysafe.claim_record;
    ELSIF a.state = 'running' AND a.lease_expires_at > p_now THEN
        IF NOT a.has_waiters THEN
            UPDATE replaysafe.actions x SET has_waiters = true
            WHERE x.tenant_id = p_tenant_id AND x.action_key = p_action_key;
        END IF;
        RETURN ('running', a.state, a.attempt, a.lease_expires_at, a.result, a.error,
                a.idempotency_key, a.provider_reference)::replaysafe.claim_record;
    ELSIF a.state = 'running' THEN
        -- The lease ran out and nobody noticed yet: the attempt's effect is unknown.
        PERFORM replaysafe._expire_attempt(a, p_now);
        IF a.on_expired = 'unknown' THEN
            UPDATE replaysafe.actions x SET state = 'unknown', updated_at = p_now
            WHERE x.tenant_id = p_tenant_id AND x.action_key = p_action_key
            RETURNING * INTO a;
            RETURN ('unknown', a.state, a.attempt, a.lease_expires_at, a.result, a.error,
                a.idempotency_key, a.provider_reference)::replaysafe.claim_record;
        END IF;
    END IF;

    -- retryable, or an expired lease under on_expired = 'reclaim': a new attempt.
    UPDATE replaysafe.actions x
    SET state = 'running', attempt = x.attempt + 1, worker_id = p_worker_id,
        lease_expires_at = p_now + p_lease, has_waiters = false, result = NULL, error = NULL,
        provider_reference = NULL, updated_at = p_now
    WHERE x.tenant_id = p_tenant_id AND x.action_key = p_action_key
    RETURNING * INTO a;
    INSERT INTO replaysafe.action_attempts (tenant_id, action_key, attempt, worker_id, claimed_at)
    VALUES (p_tenant_id, p_action_key, a.attempt, p_worker_id, p_now);
    RETURN ('claimed', a.state, a.attempt, a.lease_expires_at, a.result, a.error,
                a.idempotency_key, a.provider_reference)::replaysafe.claim_record;
END
$$;

-- Close an attempt whose lease ran out without a report, and wake its waiters.
-- The caller holds the action's row lock and moves the action out of "running".
CREATE FUNCTION replaysafe._expire_attempt(a replaysafe.actions, p_now timestamptz)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE replaysafe.action_attempts t
    SET outcome = 'unknown', ended_at = p_now,
        error = jsonb_build_object('reason', 'lease_expired', 'lease_expires_at', a.lease_expires_at)
    WHERE t.tenant_id = a.tenant_id AND t.action_key = a.action_key AND t.attempt = a.attempt;
    -- A NOTIFY fails at commit once the queue is full (any role can fill it): then the
    -- waiters claim again by the lease, as they would for a dead owner.
    IF a.has_waiters AND pg_notification_queue_usage() < 0.5 THEN
        PERFORM pg_notify('replaysafe_actions', a.idempotency_key);
    END IF;
END
$$;

-- Array variant for the parallel tool calls of one model turn: one round trip, results in
-- input order. Keys are claimed in sorted order so two overlapping batches cannot deadlock.
CREATE FUNCTION replaysafe.claim_actions(
    p_tenant_id   text,
    p_action_keys text[],
    p_operations  text[],
    p_requests    jsonb[],
    p_worker_id   text,
    p_lease       interval    DEFAULT '30 seconds',
    p_thread_id   text        DEFAULT NULL,
    p_on_expired  text        DEFAULT 'unknown',
    p_now         timestamptz DEFAULT clock_timestamp())
RETURNS SETOF replaysafe.claim_record
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n       integer := coalesce(cardinality(p_action_keys), 0);
    results replaysafe.claim_record[] := '{}';
    i       integer;
BEGIN
    IF p_action_keys IS NULL OR n <> coalesce(cardinality(p_operations), -1)
       OR n <> coalesce(cardinality(p_requests), -1) THEN
        PERFORM replaysafe._invalid('p_action_keys',
            'p_action_keys, p_operations and p_requests must be arrays of equal length');
    END IF;
    IF n > 1000 THEN
        PERFORM replaysafe._invalid('p_action_keys', 'must hold at most 1000 keys');
    END IF;
    IF array_position(p_action_keys, NULL) IS NOT NULL THEN
        PERFORM replaysafe._invalid('p_action_keys', 'must not contain NULL');
    END IF;
    IF (SELECT count(DISTINCT k) FROM unnest(p_action_keys) k) <> n THEN
        PERFORM replaysafe._invalid('p_action_keys', 'must not repeat a key');
    END IF;
    -- Each claim_action call checks its arguments, the tenant and the time.
    FOR i IN SELECT o FROM unnest(p_action_keys) WITH ORDINALITY AS u(k, o) ORDER BY k LOOP
        results[i] := replaysafe.claim_action(p_tenant_id, p_action_keys[i], p_operations[i],
                                              p_requests[i], p_worker_id, p_lease, p_thread_id,
                                              p_on_expired, p_now);
    END LOOP;
    RETURN QUERY SELECT * FROM unnest(results);
END
$$;

CREATE FUNCTION replaysafe.heartbeat_action(
    p_tenant_id  text,
    p_action_key text,
    p_attempt    integer,
    p_lease      interval    DEFAULT '30 seconds',
    p_now        timestamptz DEFAULT clock_timestamp())
RETURNS timestamptz
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_expires timestamptz;
BEGIN
    IF (octet_length(p_tenant_id) BETWEEN 1 AND 1024 AND length(p_tenant_id) <= 512
        AND octet_length(p_action_key) BETWEEN 1 AND 1024 AND length(p_action_key) <= 512)
       IS NOT TRUE THEN
        PERFORM replaysafe._check_id('p_tenant_id', p_tenant_id);
        PERFORM replaysafe._check_id('p_action_key', p_action_key);
    END IF;
    IF p_attempt IS NULL OR p_attempt < 1 THEN
        PERFORM replaysafe._invalid('p_attempt', 'must be a positive attempt number');
    END IF;
    -- No month part: '1 month -23 days' compares as 7 days but lasts 8 in a 31-day month.
    IF p_lease IS NULL OR p_lease <= interval '0' OR p_lease > interval '7 days'
       OR date_part('month', p_lease) <> 0 OR date_part('year', p_lease) <> 0 THEN
        PERFORM replaysafe._invalid('p_lease', 'must be a positive interval of at most 7 days');
    END IF;
    IF (p_now BETWEEN clock_timestamp() - interval '5 minutes' AND clock_timestamp()) IS NOT TRUE THEN
        p_now := replaysafe._check_now(p_now);
    END IF;
    PERFORM replaysafe._acts_for(p_tenant_id);

    -- state compared as text: see _report.
    UPDATE replaysafe.actions x
    SET lease_expires_at = p_now + p_lease, updated_at = p_now
    WHERE x.tenant_id = p_tenant_id AND x.action_key = p_action_key
      AND x.attempt = p_attempt AND x.state::text = 'running'
    RETURNING x.lease_expires_at INTO v_expires;
    IF NOT FOUND THEN
        PERFORM replaysafe._raise('RS002', format(
            'lease lost: attempt %s of action %s no longer holds it', p_attempt, p_action_key));
    END IF;
    RETURN v_expires;
END
$$;

-- The one implementation of an attempt's report (complete, fail, mark unknown).
-- recorded: the action was running under this attempt. late: it is still on this attempt
-- but left running without a final report (expiry, or the attempt said unknown).
-- superseded: a newer attempt or a final outcome exists; kept on the attempt row only.
CREATE FUNCTION replaysafe._report(
    p_tenant_id          text,
    p_action_key         text,
    p_attempt            integer,
    p_state              replaysafe.action_state,
    p_result             jsonb,
    p_error              jsonb,
    p_provider_reference text,
    p_now                timestamptz)
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    a         replaysafe.actions;
    v_outcome text;
    v_final   timestamptz := CASE WHEN p_state IN ('succeeded', 'failed') THEN p_now END;
    v_prior   replaysafe.action_state;
    v_claimed timestamptz;
BEGIN
    IF (octet_length(p_tenant_id) BETWEEN 1 AND 1024 AND length(p_tenant_id) <= 512
        AND octet_length(p_action_key) BETWEEN 1 AND 1024 AND length(p_action_key) <= 512)
       IS NOT TRUE THEN
        PERFORM replaysafe._check_id('p_tenant_id', p_tenant_id);
        PERFORM replaysafe._check_id('p_action_key', p_action_key);
    END IF;
    IF p_attempt IS NULL OR p_attempt < 1 THEN
        PERFORM replaysafe._invalid('p_attempt', 'must be a positive attempt number');
    END IF;
    IF (p_now BETWEEN clock_timestamp() - interval '5 minutes' AND clock_timestamp()) IS NOT TRUE THEN
        p_now := replaysafe._check_now(p_now);
    END IF;
    PERFORM replaysafe._acts_for(p_tenant_id);

    -- Hot path: the attempt still holds the action. The state is compared as text so the
    -- planner cannot pick the partial index of running rows (a walk over every running
    -- lease and every dead entry left since the last vacuum) over the primary key.
    UPDATE replaysafe.actions x
    SET state = p_state, result = p_result, error = p_error,
        provider_reference = p_provider_reference, completed_at = v_final, updated_at = p_now
    WHERE x.tenant_id = p_tenant_id AND x.action_key = p_action_key
      AND x.attempt = p_attempt AND x.state::text = 'running'
    RETURNING x.has_waiters, x.idempotency_key INTO a.has_waiters, a.idempotency_key;
    IF FOUND THEN
        v_outcome := 'recorded';
        IF a.has_waiters AND pg_notification_queue_usage() < 0.5 THEN  -- see _expire_attempt
            PERFORM pg_notify('replaysafe_actions', a.idempotency_key);
        END IF;
    ELSE
        SELECT * INTO a FROM replaysafe.actions x
        WHERE x.tenant_id = p_tenant_id AND x.action_key = p_action_key
        FOR UPDATE;
        IF NOT FOUND THEN
            PERFORM replaysafe._raise('RS006', format('action %s does not exist', p_action_key));
        END IF;
        IF p_attempt > a.attempt THEN
            PERFORM replaysafe._raise('RS006', format(
                'action %s has no attempt %s (latest is %s)', p_action_key, p_attempt, a.attempt));
        END IF;
        SELECT t.outcome, t.claimed_at INTO v_prior, v_claimed
        FROM replaysafe.action_attempts t
        WHERE t.tenant_id = p_tenant_id AND t.action_key = p_action_key AND t.attempt = p_attempt;
        -- Late: still this attempt's action, which left running without a final report from
        -- it (expiry, or its own "unknown"), and no operator has decided it since.
        IF a.attempt = p_attempt AND a.state IN ('unknown', 'retryable')
           AND (v_prior IS NULL OR v_prior = 'unknown')
           AND (a.resolved_at IS NULL OR a.resolved_at < v_claimed) THEN
            v_outcome := 'late';
            UPDATE replaysafe.actions x
            SET state = p_state, result = p_result, error = p_error,
                provider_reference = p_provider_reference, completed_at = v_final,
                updated_at = p_now
            WHERE x.tenant_id = p_tenant_id AND x.action_key = p_action_key;
        ELSE
            v_outcome := 'superseded';
        END IF;
    END IF;

    -- The attempt row keeps the report. A superseded report changes it only where the
    -- attempt has no final report yet (none, or just "unknown"), or where it reports a
    -- success the row does not show yet (the effect happened: multi_effect_actions must see
    -- it). A repeated report of an attempt whose report was recorded (a client retrying a
    -- commit that had in fact landed) leaves the recorded one as it is.
    UPDATE replaysafe.action_attempts t
    SET outcome = p_state,
        superseded = (v_outcome = 'superseded'),
        ended_at = coalesce(t.ended_at, p_now),
        result = coalesce(p_result, t.result),
        error = coalesce(p_error, t.error),
        provider_reference = coalesce(p_provider_reference, t.provider_reference)
    WHERE t.tenant_id = p_tenant_id AND t.action_key = p_action_key AND t.attempt = p_attempt
      AND (v_outcome <> 'superseded' OR t.outcome IS NULL OR t.outcome = 'unknown'
           OR (p_state = 'succeeded' AND t.outcome <> 'succeeded'));
    RETURN v_outcome;
END
$$;

CREATE FUNCTION replaysafe.complete_action(
    p_tenant_id          text,
    p_action_key         text,
    p_attempt            integer,
    p_result             jsonb,
    p_provider_reference text        DEFAULT NULL,
    p_now                timestamptz DEFAULT clock_timestamp())
RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_result IS NULL THEN
        PERFORM replaysafe._invalid('p_result', 'must not be NULL (use the JSON value null)');
    END IF;
    RETURN replaysafe._report(p_tenant_id, p_action_key, p_attempt, 'succeeded', p_result, NULL,
                              p_provider_reference, p_now);
END
$$;

CREATE FUNCTION replaysafe.fail_action(
    p_tenant_id  text,
    p_action_key text,
    p_attempt    integer,
    p_error      jsonb,
    p_retryable  boolean     DEFAULT false,
    p_now        timestamptz DEFAULT clock_timestamp())
RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_error IS NULL THEN
        PERFORM replaysafe._invalid('p_error', 'must not be NULL');
    END IF;
    IF p_retryable IS NULL THEN
        PERFORM replaysafe._invalid('p_retryable', 'must not be NULL');
    END IF;
    RETURN replaysafe._report(p_tenant_id, p_action_key, p_attempt,
                              CASE WHEN p_retryable THEN 'retryable' ELSE 'failed' END::replaysafe.action_state,
                              NULL, p_error, NULL, p_now);
END
$$;

CREATE FUNCTION replaysafe.mark_action_unknown(
    p_tenant_id  text,
    p_action_key text,
    p_attempt    integer,
    p_error      jsonb,
    p_now        timestamptz DEFAULT clock_timestamp())
RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_error IS NULL THEN
        PERFORM replaysafe._invalid('p_error', 'must not be NULL');
    END IF;
    RETURN replaysafe._report(p_tenant_id, p_action_key, p_attempt, 'unknown', NULL, p_error,
                              NULL, p_now);
END
$$;

-- Reconciliation (replaysafe_operator): decide what an unknown action became. With
-- p_expected_attempt, only while the action is still on that attempt (a stale lookup never
-- settles a newer attempt).
CREATE FUNCTION replaysafe.resolve_action(
    p_tenant_id          text,
    p_action_key         text,
    p_state              text,
    p_result             jsonb       DEFAULT NULL,
    p_error              jsonb       DEFAULT NULL,
    p_provider_reference text        DEFAULT NULL,
    p_note               text        DEFAULT NULL,
    p_now                timestamptz DEFAULT clock_timestamp(),
    p_expected_attempt   integer     DEFAULT NULL)
RETURNS replaysafe.action_state
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_state   replaysafe.action_state;
    v_old     replaysafe.action_state;
    v_attempt integer;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM replaysafe._caller_scope c WHERE c.owner_or_operator) THEN
        -- EXECUTE is the operators'; a grant to another role by mistake must not open it.
        PERFORM replaysafe._raise('RS004', 'access denied: settling, reopening and purging are '
                                           'replaysafe_operator''s duty');
    END IF;
    IF (octet_length(p_tenant_id) BETWEEN 1 AND 1024 AND length(p_tenant_id) <= 512
        AND octet_length(p_action_key) BETWEEN 1 AND 1024 AND length(p_action_key) <= 512)
       IS NOT TRUE THEN
        PERFORM replaysafe._check_id('p_tenant_id', p_tenant_id);
        PERFORM replaysafe._check_id('p_action_key', p_action_key);
    END IF;
    IF p_state IS NULL OR p_state NOT IN ('succeeded', 'failed', 'retryable') THEN
        PERFORM replaysafe._invalid('p_state', 'must be ''succeeded'', ''failed'' or ''retryable''');
    END IF;
    IF p_expected_attempt < 1 THEN
        PERFORM replaysafe._invalid('p_expected_attempt', 'must be a positive attempt number');
    END IF;
    IF (p_now BETWEEN clock_timestamp() - interval '5 minutes' AND clock_timestamp()) IS NOT TRUE THEN
        p_now := replaysafe._check_now(p_now);
    END IF;
    PERFORM replaysafe._acts_for(p_tenant_id);
    v_state := p_state::replaysafe.action_state;

    SELECT x.state, x.attempt INTO v_old, v_attempt FROM replaysafe.actions x
    WHERE x.tenant_id = p_tenant_id AND x.action_key = p_action_key
    FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM replaysafe._raise('RS006', format('action %s does not exist', p_action_key));
    END IF;
    IF v_old <> 'unknown' THEN
        PERFORM replaysafe._raise('RS006', format(
            'action %s is %s; only unknown actions can be resolved', p_action_key, v_old));
    END IF;
    IF p_expected_attempt IS NOT NULL AND p_expected_attempt <> v_attempt THEN
        PERFORM replaysafe._raise('RS006', format(
            'action %s is on attempt %s, not %s', p_action_key, v_attempt, p_expected_attempt));
    END IF;

    UPDATE replaysafe.actions x
    SET state = v_state, result = p_result, error = p_error,
        provider_reference = coalesce(p_provider_reference, x.provider_reference),
        resolution_note = p_note, resolved_at = p_now, updated_at = p_now,
        completed_at = CASE WHEN v_state IN ('succeeded', 'failed') THEN p_now END
    WHERE x.tenant_id = p_tenant_id AND x.action_key = p_action_key;
    RETURN v_state;
END
$$;

-- An operator's decision that a failed action may run again (it failed on a bug since
-- fixed, say): it becomes retryable; the note and the time stay on the action.
CREATE FUNCTION replaysafe.reopen_action(
    p_tenant_id  text,
    p_action_key text,
    p_note       text,
    p_now        timestamptz DEFAULT clock_timestamp())
RETURNS replaysafe.action_state
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_old replaysafe.action_state;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM replaysafe._caller_scope c WHERE c.owner_or_operator) THEN
        -- EXECUTE is the operators'; a grant to another role by mistake must not open it.
        PERFORM replaysafe._raise('RS004', 'access denied: settling, reopening and purging are '
                                           'replaysafe_operator''s duty');
    END IF;
    PERFORM replaysafe._check_id('p_tenant_id', p_tenant_id);
    PERFORM replaysafe._check_id('p_action_key', p_action_key);
    IF p_note IS NULL OR p_note = '' THEN
        PERFORM replaysafe._invalid('p_note', 'must say why the action may run again');
    END IF;
    IF (p_now BETWEEN clock_timestamp() - interval '5 minutes' AND clock_timestamp()) IS NOT TRUE THEN
        p_now := replaysafe._check_now(p_now);
    END IF;
    PERFORM replaysafe._acts_for(p_tenant_id);

    SELECT x.state INTO v_old FROM replaysafe.actions x
    WHERE x.tenant_id = p_tenant_id AND x.action_key = p_action_key
    FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM replaysafe._raise('RS006', format('action %s does not exist', p_action_key));
    END IF;
    IF v_old <> 'failed' THEN
        PERFORM replaysafe._raise('RS006', format(
            'action %s is %s; only failed actions can be reopened', p_action_key, v_old));
    END IF;
    UPDATE replaysafe.actions x
    SET state = 'retryable', resolution_note = p_note, resolved_at = p_now, updated_at = p_now,
        completed_at = NULL
    WHERE x.tenant_id = p_tenant_id AND x.action_key = p_action_key;
    RETURN 'retryable';
END
$$;

-- Expired running leases become unknown (or retryable under on_expired = 'reclaim'), for
-- the caller's tenant (every tenant for the unbound schema owner). Rows locked by a
-- concurrent claim or report are skipped: that caller decides them.
CREATE FUNCTION replaysafe.sweep_expired_actions(
    p_limit integer     DEFAULT 1000,
    p_now   timestamptz DEFAULT clock_timestamp())
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_count  integer;
    v_keys   text[];
    v_tenant text;
    v_all    boolean;
BEGIN
    IF p_limit IS NULL OR p_limit < 1 THEN
        PERFORM replaysafe._invalid('p_limit', 'must be a positive integer');
    END IF;
    IF (p_now BETWEEN clock_timestamp() - interval '5 minutes' AND clock_timestamp()) IS NOT TRUE THEN
        p_now := replaysafe._check_now(p_now);
    END IF;
    SELECT c.tenant_id, c.acts_for_all INTO v_tenant, v_all FROM replaysafe._caller_scope c;
    IF v_tenant IS NULL AND NOT v_all THEN
        RETURN 0;
    END IF;

    WITH due AS (
        SELECT x.tenant_id, x.action_key, x.attempt, x.on_expired, x.has_waiters,
               x.idempotency_key, x.lease_expires_at
        FROM replaysafe.actions x
        WHERE x.state = 'running' AND x.lease_expires_at <= p_now
          AND (v_tenant IS NULL OR x.tenant_id = v_tenant)
        ORDER BY x.lease_expires_at
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    ), moved AS (
        UPDATE replaysafe.actions x
        SET state = CASE WHEN d.on_expired = 'reclaim' THEN 'retryable' ELSE 'unknown' END::replaysafe.action_state,
            updated_at = p_now
        FROM due d
        WHERE x.tenant_id = d.tenant_id AND x.action_key = d.action_key
        RETURNING x.tenant_id
    ), closed AS (  -- data-modifying CTEs always run to completion
        UPDATE replaysafe.action_attempts t
        SET outcome = 'unknown', ended_at = p_now,
            error = jsonb_build_object('reason', 'lease_expired', 'lease_expires_at', d.lease_expires_at)
        FROM due d
        WHERE t.tenant_id = d.tenant_id AND t.action_key = d.action_key AND t.attempt = d.attempt
        RETURNING t.tenant_id
    )
    SELECT (SELECT count(*) FROM moved), array_agg(d.idempotency_key) FILTER (WHERE d.has_waiters)
    INTO v_count, v_keys
    FROM due d;

    IF pg_notification_queue_usage() < 0.5 THEN  -- see _expire_attempt
        PERFORM pg_notify('replaysafe_actions', k) FROM unnest(v_keys) AS k;
    END IF;
    RETURN coalesce(v_count, 0);
END
$$;

-- Delete terminal actions (and their attempts) finished before p_now - p_older_than, of the
-- caller's tenant (every tenant for the unbound schema owner). Batched by p_limit; never
-- touches running, unknown or retryable actions. replaysafe_operator only: once purged, a
-- key would run again.
CREATE FUNCTION replaysafe.purge_actions(
    p_older_than interval,
    p_limit      integer     DEFAULT 10000,
    p_now        timestamptz DEFAULT clock_timestamp())
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_count  integer;
    v_tenant text;
    v_all    boolean;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM replaysafe._caller_scope c WHERE c.owner_or_operator) THEN
        -- EXECUTE is the operators'; a grant to another role by mistake must not open it.
        PERFORM replaysafe._raise('RS004', 'access denied: settling, reopening and purging are '
                                           'replaysafe_operator''s duty');
    END IF;
    IF p_older_than IS NULL OR p_older_than < interval '0' OR p_older_than > interval '1000 years' THEN
        PERFORM replaysafe._invalid('p_older_than', 'must be a non-negative interval of at most 1000 years');
    END IF;
    IF p_limit IS NULL OR p_limit < 1 THEN
        PERFORM replaysafe._invalid('p_limit', 'must be a positive integer');
    END IF;
    IF (p_now BETWEEN clock_timestamp() - interval '5 minutes' AND clock_timestamp()) IS NOT TRUE THEN
        p_now := replaysafe._check_now(p_now);
    END IF;
    SELECT c.tenant_id, c.acts_for_all INTO v_tenant, v_all FROM replaysafe._caller_scope c;
    IF v_tenant IS NULL AND NOT v_all THEN
        RETURN 0;
    END IF;

    WITH victims AS (
        SELECT x.tenant_id, x.action_key
        FROM replaysafe.actions x
        WHERE x.state IN ('succeeded', 'failed') AND x.completed_at < p_now - p_older_than
          AND (v_tenant IS NULL OR x.tenant_id = v_tenant)
        ORDER BY x.completed_at
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    ), gone_attempts AS (  -- data-modifying CTEs always run to completion
        DELETE FROM replaysafe.action_attempts t
        USING victims v
        WHERE t.tenant_id = v.tenant_id AND t.action_key = v.action_key
        RETURNING t.tenant_id
    ), gone AS (
        DELETE FROM replaysafe.actions x
        USING victims v
        WHERE x.tenant_id = v.tenant_id AND x.action_key = v.action_key
        RETURNING x.tenant_id
    )
    SELECT count(*) INTO v_count FROM gone;
    RETURN v_count;
END
$$;

-- ---------------------------------------------------------------------------------------
-- Versioned thread state: compare-and-swap writes, bounded history, ownership by user id,
-- tombstones that keep the version counter.
-- ---------------------------------------------------------------------------------------

-- Slow path of the thread functions' argument check: name the offending argument.
CREATE FUNCTION replaysafe._check_thread_args(p_tenant_id text, p_thread_id text, p_user_id text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM replaysafe._check_id('p_tenant_id', p_tenant_id);
    PERFORM replaysafe._check_id('p_thread_id', p_thread_id);
    PERFORM replaysafe._check_id('p_user_id', p_user_id, true);
END
$$;

-- One message for every ownership refusal: it names neither the owner nor the version.
CREATE FUNCTION replaysafe._deny_thread()
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM replaysafe._raise('RS004', 'access denied: this user may not use that thread');
END
$$;

CREATE FUNCTION replaysafe._stale_thread(p_thread_id text, p_expected bigint, p_current bigint)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM replaysafe._raise('RS003',
        format('stale thread state: thread %s is at version %s, the write expected %s',
               p_thread_id, p_current, p_expected),
        jsonb_build_object('thread_id', p_thread_id, 'expected_version', p_expected,
                           'current_version', p_current)::text);
END
$$;

-- Latest state: (0, NULL, NULL) when the thread was never written; (tombstone version,
-- NULL, deleted at) after delete_thread. Always exactly one row.
CREATE FUNCTION replaysafe.read_thread(
    p_tenant_id text,
    p_thread_id text,
    p_user_id   text DEFAULT NULL)
RETURNS SETOF replaysafe.thread_record
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t replaysafe.threads;
    r replaysafe.thread_record;
BEGIN
    IF (octet_length(p_tenant_id) BETWEEN 1 AND 1024 AND length(p_tenant_id) <= 512
        AND octet_length(p_thread_id) BETWEEN 1 AND 1024 AND length(p_thread_id) <= 512
        AND (p_user_id IS NULL
             OR (octet_length(p_user_id) BETWEEN 1 AND 1024 AND length(p_user_id) <= 512)))
       IS NOT TRUE THEN
        PERFORM replaysafe._check_thread_args(p_tenant_id, p_thread_id, p_user_id);
    END IF;
    PERFORM replaysafe._acts_for(p_tenant_id);

    SELECT * INTO t FROM replaysafe.threads x
    WHERE x.tenant_id = p_tenant_id AND x.thread_id = p_thread_id;
    IF NOT FOUND THEN
        r.version := 0;
        RETURN NEXT r;
        RETURN;
    END IF;
    IF t.user_id IS NOT NULL AND t.user_id IS DISTINCT FROM p_user_id THEN
        PERFORM replaysafe._deny_thread();
    END IF;
    r.version := t.version;
    r.updated_at := t.updated_at;
    -- A tombstone's version has no state row: NULL.
    SELECT v.state INTO r.state FROM replaysafe.thread_versions v
    WHERE v.tenant_id = p_tenant_id AND v.thread_id = p_thread_id AND v.version = t.version;
    RETURN NEXT r;
END
$$;

-- Compare-and-swap write. p_expected_version = 0 creates the thread (owned by p_user_id);
-- any other value must equal the current version (of the state or of a tombstone).
-- Returns the new version; RS003 when another write (or delete) got there first.
-- Prunes versions that fall outside the history limit: at most one row per write in the
-- steady state, the difference once when the limit is lowered.
CREATE FUNCTION replaysafe.write_thread(
    p_tenant_id        text,
    p_thread_id        text,
    p_expected_version bigint,
    p_state            jsonb,
    p_user_id          text    DEFAULT NULL,
    p_history_limit    integer DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t         replaysafe.threads;
    v_version bigint;
    v_limit   integer;
    v_oldest  bigint;
    v_now     timestamptz := clock_timestamp();
BEGIN
    IF (octet_length(p_tenant_id) BETWEEN 1 AND 1024 AND length(p_tenant_id) <= 512
        AND octet_length(p_thread_id) BETWEEN 1 AND 1024 AND length(p_thread_id) <= 512
        AND (p_user_id IS NULL
             OR (octet_length(p_user_id) BETWEEN 1 AND 1024 AND length(p_user_id) <= 512)))
       IS NOT TRUE THEN
        PERFORM replaysafe._check_thread_args(p_tenant_id, p_thread_id, p_user_id);
    END IF;
    IF p_expected_version IS NULL OR p_expected_version < 0 THEN
        PERFORM replaysafe._invalid('p_expected_version',
            'must be 0 (create) or the version last read (got '
            || coalesce(p_expected_version::text, 'NULL') || ')');
    END IF;
    IF p_state IS NULL OR jsonb_typeof(p_state) <> 'object' THEN
        PERFORM replaysafe._invalid('p_state', 'must be a JSON object');
    END IF;
    IF p_history_limit < 1 THEN
        PERFORM replaysafe._invalid('p_history_limit',
            'must be a positive number of versions (got ' || p_history_limit || ')');
    END IF;
    PERFORM replaysafe._acts_for(p_tenant_id);

    IF p_expected_version = 0 THEN
        INSERT INTO replaysafe.threads AS x (
            tenant_id, thread_id, user_id, version, history_limit, oldest_kept, created_at,
            updated_at)
        VALUES (p_tenant_id, p_thread_id, p_user_id, 1, coalesce(p_history_limit, 20), 1,
                v_now, v_now)
        ON CONFLICT DO NOTHING;
        IF FOUND THEN
            INSERT INTO replaysafe.thread_versions (tenant_id, thread_id, version, state, created_at)
            VALUES (p_tenant_id, p_thread_id, 1, p_state, v_now);
            RETURN 1;
        END IF;
        -- It exists (perhaps just created by a concurrent writer): a conflict, below.
    END IF;

    -- No lock: if the CAS update below succeeds, the row still has exactly these values,
    -- because every change of a head row bumps its version.
    SELECT * INTO t FROM replaysafe.threads x
    WHERE x.tenant_id = p_tenant_id AND x.thread_id = p_thread_id;
    IF FOUND AND t.user_id IS NOT NULL AND t.user_id IS DISTINCT FROM p_user_id THEN
        PERFORM replaysafe._deny_thread();
    END IF;
    IF NOT FOUND OR t.version <> p_expected_version THEN
        PERFORM replaysafe._stale_thread(p_thread_id, p_expected_version, coalesce(t.version, 0));
    END IF;

    v_version := t.version + 1;
    v_limit := coalesce(p_history_limit, t.history_limit);
    v_oldest := greatest(t.oldest_kept, v_version - v_limit + 1);

    UPDATE replaysafe.threads x
    SET version = v_version, history_limit = v_limit, oldest_kept = v_oldest, deleted = false,
        updated_at = v_now
    WHERE x.tenant_id = p_tenant_id AND x.thread_id = p_thread_id
      AND x.version = p_expected_version;
    IF NOT FOUND THEN
        -- Lost the race between our read and our update.
        SELECT x.version INTO v_version FROM replaysafe.threads x
        WHERE x.tenant_id = p_tenant_id AND x.thread_id = p_thread_id;
        PERFORM replaysafe._stale_thread(p_thread_id, p_expected_version, v_version);
    END IF;

    INSERT INTO replaysafe.thread_versions (tenant_id, thread_id, version, state, created_at)
    VALUES (p_tenant_id, p_thread_id, v_version, p_state, v_now);
    IF v_oldest > t.oldest_kept THEN
        DELETE FROM replaysafe.thread_versions v
        WHERE v.tenant_id = p_tenant_id AND v.thread_id = p_thread_id
          AND v.version >= t.oldest_kept AND v.version < v_oldest;
    END IF;
    RETURN v_version;
END
$$;

-- Kept versions, newest first (at most p_limit). Empty for an absent or deleted thread.
CREATE FUNCTION replaysafe.thread_history(
    p_tenant_id text,
    p_thread_id text,
    p_user_id   text    DEFAULT NULL,
    p_limit     integer DEFAULT 100)
RETURNS TABLE (version bigint, state jsonb, created_at timestamptz)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_owner text;
BEGIN
    IF (octet_length(p_tenant_id) BETWEEN 1 AND 1024 AND length(p_tenant_id) <= 512
        AND octet_length(p_thread_id) BETWEEN 1 AND 1024 AND length(p_thread_id) <= 512
        AND (p_user_id IS NULL
             OR (octet_length(p_user_id) BETWEEN 1 AND 1024 AND length(p_user_id) <= 512)))
       IS NOT TRUE THEN
        PERFORM replaysafe._check_thread_args(p_tenant_id, p_thread_id, p_user_id);
    END IF;
    IF p_limit IS NULL OR p_limit < 1 THEN
        PERFORM replaysafe._invalid('p_limit', 'must be a positive integer');
    END IF;
    PERFORM replaysafe._acts_for(p_tenant_id);

    SELECT t.user_id INTO v_owner FROM replaysafe.threads t
    WHERE t.tenant_id = p_tenant_id AND t.thread_id = p_thread_id;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF v_owner IS NOT NULL AND v_owner IS DISTINCT FROM p_user_id THEN
        PERFORM replaysafe._deny_thread();
    END IF;

    RETURN QUERY
        SELECT v.version, v.state, v.created_at
        FROM replaysafe.thread_versions v
        WHERE v.tenant_id = p_tenant_id AND v.thread_id = p_thread_id
        ORDER BY v.version DESC
        LIMIT p_limit;
END
$$;

-- Removes the state and its history; the head row stays as a tombstone one version up, so
-- the counter is never reused and the owner is kept. False for an absent or deleted thread.
CREATE FUNCTION replaysafe.delete_thread(
    p_tenant_id text,
    p_thread_id text,
    p_user_id   text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t replaysafe.threads;
BEGIN
    IF (octet_length(p_tenant_id) BETWEEN 1 AND 1024 AND length(p_tenant_id) <= 512
        AND octet_length(p_thread_id) BETWEEN 1 AND 1024 AND length(p_thread_id) <= 512
        AND (p_user_id IS NULL
             OR (octet_length(p_user_id) BETWEEN 1 AND 1024 AND length(p_user_id) <= 512)))
       IS NOT TRUE THEN
        PERFORM replaysafe._check_thread_args(p_tenant_id, p_thread_id, p_user_id);
    END IF;
    PERFORM replaysafe._acts_for(p_tenant_id);

    -- Ownership first, without a lock: a refused caller must not block the owner.
    SELECT * INTO t FROM replaysafe.threads x
    WHERE x.tenant_id = p_tenant_id AND x.thread_id = p_thread_id;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF t.user_id IS NOT NULL AND t.user_id IS DISTINCT FROM p_user_id THEN
        PERFORM replaysafe._deny_thread();
    END IF;

    SELECT * INTO t FROM replaysafe.threads x
    WHERE x.tenant_id = p_tenant_id AND x.thread_id = p_thread_id
    FOR UPDATE;
    IF t.deleted THEN
        RETURN false;
    END IF;
    UPDATE replaysafe.threads x
    SET version = t.version + 1, deleted = true, oldest_kept = t.version + 2,
        updated_at = clock_timestamp()
    WHERE x.tenant_id = p_tenant_id AND x.thread_id = p_thread_id;
    DELETE FROM replaysafe.thread_versions v
    WHERE v.tenant_id = p_tenant_id AND v.thread_id = p_thread_id
      AND v.version >= t.oldest_kept AND v.version <= t.version;
    RETURN true;
END
$$;

-- ---------------------------------------------------------------------------------------
-- Audit views: owner-rights (they read the private tables) and security_barrier (a reader's
-- own functions in a WHERE clause never see rows the filter removes). Each shows the
-- reader's tenant only (every tenant to the unbound owner and unbound auditors).
--
-- The private _visible_* views do the filtering as a UNION ALL: the reader's tenant as an
-- index condition (a reader's own conditions join it, so no row of another tenant is ever
-- read: EXPLAIN ANALYZE cannot confirm another tenant's key by "Rows Removed by Filter"),
-- and every row behind a one-time test of reads_all, never executed for anyone else.
-- ---------------------------------------------------------------------------------------

CREATE VIEW replaysafe._visible_actions WITH (security_barrier = true) AS
SELECT x.* FROM replaysafe.actions x
WHERE x.tenant_id = (SELECT r.tenant_id FROM replaysafe._reader r)
UNION ALL
SELECT x.* FROM replaysafe.actions x
WHERE (SELECT r.reads_all FROM replaysafe._reader r);

CREATE VIEW replaysafe._visible_attempts WITH (security_barrier = true) AS
SELECT t.* FROM replaysafe.action_attempts t
WHERE t.tenant_id = (SELECT r.tenant_id FROM replaysafe._reader r)
UNION ALL
SELECT t.* FROM replaysafe.action_attempts t
WHERE (SELECT r.reads_all FROM replaysafe._reader r);

CREATE VIEW replaysafe._visible_threads WITH (security_barrier = true) AS
SELECT t.* FROM replaysafe.threads t
WHERE t.tenant_id = (SELECT r.tenant_id FROM replaysafe._reader r)
UNION ALL
SELECT t.* FROM replaysafe.threads t
WHERE (SELECT r.reads_all FROM replaysafe._reader r);

CREATE VIEW replaysafe.actions_v WITH (security_barrier = true) AS
SELECT x.tenant_id, x.action_key, x.thread_id, x.operation, x.state, x.attempt, x.on_expired,
       x.idempotency_key, x.request, x.result, x.error, x.provider_reference, x.lease_expires_at,
       x.created_at, x.updated_at, x.completed_at, x.worker_id, x.resolution_note, x.resolved_at
FROM replaysafe._visible_actions x;

CREATE VIEW replaysafe.action_attempts_v WITH (security_barrier = true) AS
SELECT t.tenant_id, t.action_key, t.attempt, t.worker_id, t.claimed_at, t.ended_at, t.outcome,
       t.superseded, t.error, t.result, t.provider_reference
FROM replaysafe._visible_attempts t;

CREATE VIEW replaysafe.unresolved_actions WITH (security_barrier = true) AS
SELECT x.tenant_id, x.action_key, x.operation, x.state, x.lease_expires_at,
       now() - CASE WHEN x.state = 'running' THEN x.lease_expires_at ELSE x.updated_at END AS age,
       x.thread_id, x.created_at, x.updated_at
FROM replaysafe._visible_actions x
WHERE x.state = 'unknown' OR (x.state = 'running' AND x.lease_expires_at <= now());

CREATE VIEW replaysafe.multi_effect_actions WITH (security_barrier = true) AS
SELECT t.tenant_id, t.action_key, a.operation, count(*) AS successful_attempts
FROM replaysafe._visible_attempts t
JOIN replaysafe.actions a ON a.tenant_id = t.tenant_id AND a.action_key = t.action_key
WHERE t.outcome = 'succeeded'
GROUP BY t.tenant_id, t.action_key, a.operation
HAVING count(*) > 1;

-- Ownership by user id is enforced by the functions; the view shows every thread of the
-- reader's tenant.
CREATE VIEW replaysafe.threads_v WITH (security_barrier = true) AS
SELECT t.tenant_id, t.thread_id, t.user_id, t.version, t.deleted, v.state, t.history_limit,
       t.created_at, t.updated_at
FROM replaysafe._visible_threads t
LEFT JOIN replaysafe.thread_versions v
       ON v.tenant_id = t.tenant_id AND v.thread_id = t.thread_id AND v.version = t.version;

-- ---------------------------------------------------------------------------------------
-- Privileges. Row-level security stays enabled with no policy on every table: should a
-- privilege on a table ever be granted by mistake, that role still reads and writes nothing
-- (the owner, which the functions run as, is not subject to it: it costs them nothing).
-- ---------------------------------------------------------------------------------------

ALTER TABLE replaysafe.role_bindings ENABLE ROW LEVEL SECURITY;
ALTER TABLE replaysafe.installation ENABLE ROW LEVEL SECURITY;
ALTER TABLE replaysafe.actions ENABLE ROW LEVEL SECURITY;
ALTER TABLE replaysafe.action_attempts ENABLE ROW LEVEL SECURITY;
ALTER TABLE replaysafe.threads ENABLE ROW LEVEL SECURITY;
ALTER TABLE replaysafe.thread_versions ENABLE ROW LEVEL SECURITY;

-- Every privilege but the owner's goes first, whoever granted it (PUBLIC's default EXECUTE
-- on functions, and what ALTER DEFAULT PRIVILEGES may have added, on the schema too); then
-- the grants below.
DO $revoke$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT DISTINCT 'FUNCTION ' || p.oid::regprocedure::text AS object, a.grantee
        FROM pg_proc p, aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
        WHERE p.pronamespace = 'replaysafe'::regnamespace AND a.grantee <> p.proowner
        UNION
        SELECT DISTINCT 'TABLE ' || c.oid::regclass::text, a.grantee
        FROM pg_class c, aclexplode(c.relacl) a
        WHERE c.relnamespace = 'replaysafe'::regnamespace AND c.relkind IN ('r', 'v', 'p', 'm', 'S')
          AND a.grantee <> c.relowner
        UNION
        SELECT DISTINCT 'SCHEMA replaysafe', a.grantee
        FROM pg_namespace n, aclexplode(n.nspacl) a
        WHERE n.nspname = 'replaysafe' AND a.grantee <> n.nspowner
    LOOP
        EXECUTE format('REVOKE ALL ON %s FROM %s', r.object,
                       CASE WHEN r.grantee = 0 THEN 'PUBLIC' ELSE r.grantee::regrole::text END);
    END LOOP;
END
$revoke$;

DO $grants$
DECLARE
    v_views constant text := 'replaysafe.actions_v, replaysafe.action_attempts_v, '
        'replaysafe.unresolved_actions, replaysafe.multi_effect_actions, replaysafe.threads_v';
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'replaysafe_worker') THEN
        GRANT USAGE ON SCHEMA replaysafe TO replaysafe_worker;
        GRANT EXECUTE ON FUNCTION
            replaysafe.claim_action(text, text, text, jsonb, text, interval, text, text, timestamptz),
            replaysafe.claim_actions(text, text[], text[], jsonb[], text, interval, text, text, timestamptz),
            replaysafe.heartbeat_action(text, text, integer, interval, timestamptz),
            replaysafe.complete_action(text, text, integer, jsonb, text, timestamptz),
            replaysafe.fail_action(text, text, integer, jsonb, boolean, timestamptz),
            replaysafe.mark_action_unknown(text, text, integer, jsonb, timestamptz),
            replaysafe.sweep_expired_actions(integer, timestamptz),
            replaysafe.read_thread(text, text, text),
            replaysafe.write_thread(text, text, bigint, jsonb, text, integer),
            replaysafe.thread_history(text, text, text, integer),
            replaysafe.delete_thread(text, text, text)
        TO replaysafe_worker;
        EXECUTE 'GRANT SELECT ON ' || v_views || ' TO replaysafe_worker';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'replaysafe_auditor') THEN
        GRANT USAGE ON SCHEMA replaysafe TO replaysafe_auditor;
        EXECUTE 'GRANT SELECT ON ' || v_views || ' TO replaysafe_auditor';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'replaysafe_operator') THEN
        GRANT USAGE ON SCHEMA replaysafe TO replaysafe_operator;
        GRANT EXECUTE ON FUNCTION
            replaysafe.resolve_action(text, text, text, jsonb, jsonb, text, text, timestamptz, integer),
            replaysafe.reopen_action(text, text, text, timestamptz),
            replaysafe.purge_actions(interval, integer, timestamptz),
            replaysafe.sweep_expired_actions(integer, timestamptz)
        TO replaysafe_operator;
        EXECUTE 'GRANT SELECT ON ' || v_views || ' TO replaysafe_operator';
    END IF;
END
$grants$;

-- replaysafe's function set: every function, view and privilege of the schema
-- (sql/functions, sql/views, sql/grants.sql), applied whole after a revision's DDL.
SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
SELECT pg_catalog.set_config('replaysafe.outer_check_function_bodies',
                             pg_catalog.current_setting('check_function_bodies'), true);
SELECT pg_catalog.set_config('check_function_bodies', 'off', true);

-- Argument checks and errors shared by every function: private helpers (SECURITY INVOKER:
-- only the definer functions, running as the owner, may call them). Deliberate errors use
-- SQLSTATE class RS (RS001..RS006, see docs/errors.md).

CREATE OR REPLACE FUNCTION replaysafe._raise(p_sqlstate text, p_message text, p_detail text DEFAULT NULL)
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

CREATE OR REPLACE FUNCTION replaysafe._invalid(p_name text, p_rule text)
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
CREATE OR REPLACE FUNCTION replaysafe._check_id(p_name text, p_value text, p_nullable boolean DEFAULT false)
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

-- Slow path of the time checks: p_now is NULL, not finite, outside the years a client can
-- represent, in the future, or more than 5 minutes before the database clock. Returns the
-- time the call uses. Only the schema owner and replaysafe_operator members may move time:
-- from anyone else a time more than 5 minutes away is refused, and a time in the future
-- (within those 5 minutes: client clocks drift) is taken as the clock, so a worker can never
-- expire or re-claim another caller's lease early. A caller with a tenant grant may move time
-- only when the grant too gives it the operator duty (the tenant check follows and verifies
-- the grant; here it is only read; p_report: see _acts_with_grant).
CREATE OR REPLACE FUNCTION replaysafe._check_now(p_now timestamptz, p_grant text DEFAULT NULL,
                                                 p_report boolean DEFAULT false)
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
    IF p_grant IS NULL THEN
        IF EXISTS (SELECT 1 FROM replaysafe._caller_scope c WHERE c.owner_or_operator) THEN
            RETURN p_now;
        END IF;
    -- Under a grant, the operator duty must be both the grant's and the caller's (USAGE).
    ELSIF (replaysafe._acts_with_grant(NULL, p_grant, '{worker,operator,auditor}', p_report)
           -> 'dut') ? 'operator'
          AND EXISTS (SELECT 1 FROM replaysafe._caller c
                      WHERE NOT c.restricted AND pg_has_role(
                          c.role_name, coalesce(to_regrole('replaysafe_operator')::oid, 0::oid),
                          'USAGE')) THEN
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

-- Every write is durable when it commits, whatever the session says: a caller's own
-- "synchronous_commit = off" (or one a pooled server connection kept from another client)
-- would let a committed claim vanish in a crash, and its tool run again. Raised to "on" for
-- the rest of the transaction (never lowered: "remote_write" and "remote_apply" stay).
CREATE OR REPLACE FUNCTION replaysafe._durable()
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
END
$$;

-- The digits of the longest number in a JSON value when one has more than p_digits (NULL
-- when none has): jsonb prints every number in full, with every digit of its scale (the
-- scale is kept, not the zeros: 1e131071 is 15 bytes in and 131,072 digits out, and
-- round(1::numeric, 16383) stores in a few bytes and prints 16,385 characters), so a few
-- bytes stored could print a gigabyte. The digits of a number are those before its point (at
-- least one) and its scale. Every number is read once, measured through its scale and its
-- magnitude; only a number that may be too long is measured exactly, and a huge one is never
-- printed.
CREATE OR REPLACE FUNCTION replaysafe._long_number(p_value jsonb, p_digits bigint)
RETURNS bigint
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_numbers jsonb;
    v_scale   integer;
    v_largest numeric;
    v_big     numeric;
    v_long    numeric;
BEGIN
    IF p_value IS NULL OR p_digits IS NULL THEN
        RETURN NULL;
    END IF;
    v_numbers := jsonb_path_query_array(p_value, 'strict $.** ? (@.type() == "number")');
    IF v_numbers = '[]'::jsonb THEN
        RETURN NULL;
    END IF;
    SELECT max(scale(e.x::numeric)), max(abs(e.x::numeric)) INTO v_scale, v_largest
    FROM jsonb_array_elements(v_numbers) e(x);
    v_big := power(10::numeric, least(p_digits, 131071)::integer);
    -- The longest fraction and the largest magnitude together keep the limit: every number does.
    IF v_scale < p_digits AND v_largest < v_big THEN
        IF v_scale + length(trunc(v_largest)::text) <= p_digits THEN
            RETURN NULL;
        END IF;
    END IF;
    SELECT m.n INTO v_long
    FROM jsonb_array_elements(v_numbers) e(x), LATERAL (SELECT e.x::numeric AS n) m
    WHERE CASE WHEN scale(m.n) >= p_digits OR abs(m.n) >= v_big THEN true
               ELSE scale(m.n) + length(trunc(abs(m.n))::text) > p_digits END
    LIMIT 1;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    RETURN scale(v_long) + length(trunc(abs(v_long))::text);
END
$$;

-- How a JSON value breaks its limits: NULL when it keeps them, else {"bytes": stored size}
-- when it is larger than p_max bytes (pg_column_size), or {"digits": n} for a number of more
-- than p_digits digits (_long_number). A NULL limit is not enforced.
CREATE OR REPLACE FUNCTION replaysafe._oversize(p_value jsonb, p_max bigint, p_digits bigint)
RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_digits bigint;
BEGIN
    IF pg_column_size(p_value) > p_max THEN
        RETURN jsonb_build_object('bytes', pg_column_size(p_value));
    END IF;
    v_digits := replaysafe._long_number(p_value, p_digits);
    IF v_digits IS NOT NULL THEN
        RETURN jsonb_build_object('digits', v_digits);
    END IF;
    RETURN NULL;
END
$$;

-- RS005 unless a JSON argument keeps its limits (_oversize); p_limit names the column of
-- replaysafe.limits p_max comes from, for the message.
CREATE OR REPLACE FUNCTION replaysafe._check_size(p_name text, p_value jsonb, p_limit text,
                                                  p_max bigint, p_digits bigint)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_over jsonb := replaysafe._oversize(p_value, p_max, p_digits);
BEGIN
    IF v_over ? 'bytes' THEN
        PERFORM replaysafe._check_bytes(p_name, (v_over ->> 'bytes')::bigint, p_limit, p_max);
    ELSIF v_over ? 'digits' THEN
        PERFORM replaysafe._invalid(p_name, format(
            'holds a number of %s digits, over the limit of %s digits (replaysafe.limits '
            'number_digits)', v_over ->> 'digits', p_digits));
    END IF;
END
$$;

-- RS005 unless a stored size (pg_column_size of the argument) is at most p_max.
CREATE OR REPLACE FUNCTION replaysafe._check_bytes(p_name text, p_size bigint, p_limit text,
                                                   p_max bigint)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_size > p_max THEN
        PERFORM replaysafe._invalid(p_name, format(
            'is %s bytes stored, over its limit of %s bytes (replaysafe.limits %s)',
            p_size, p_max, p_limit));
    END IF;
END
$$;

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

-- The action ledger: claims, and the attempts they start.

-- The derived idempotency key: fixed length (68 characters), salted with the installation's
-- secret (nested hash, so no length extension), the tenant length-prefixed so no two
-- (tenant, key) pairs collide by concatenation. Owner only: the key reaches a caller only in
-- the answer to its own claim.
CREATE OR REPLACE FUNCTION replaysafe.idempotency_key(p_tenant_id text, p_action_key text)
RETURNS text
LANGUAGE sql STABLE STRICT
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT 'rs2_' || encode(sha256(i.key_secret || sha256(i.key_secret || convert_to(
        length(p_tenant_id)::text || ':' || p_tenant_id || p_action_key, 'UTF8'))), 'hex')
    FROM replaysafe.installation i
$$;

-- An attempt's token, its capability (heartbeats and reports must present it). Made by the
-- database, returned only in the claim's own answer; only its sha256 is stored. With a claim
-- token it is derived from it (with the installation's token_secret: nested hash, each id
-- length-prefixed), so a claim-token retry answers the same token again; without one it is
-- random (244 bits). Never equal to the claim token.
CREATE OR REPLACE FUNCTION replaysafe._attempt_token(p_tenant_id text, p_action_key text,
                                                     p_attempt integer, p_claim_token text)
RETURNS text
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT 'rsat_' || CASE
        WHEN p_claim_token IS NULL
            THEN replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', '')
        ELSE encode(sha256(i.token_secret || sha256(i.token_secret || convert_to(
            length(p_tenant_id)::text || ':' || p_tenant_id || length(p_action_key)::text || ':'
            || p_action_key || p_attempt::text || ':' || p_claim_token, 'UTF8'))), 'hex') END
    FROM replaysafe.installation i
$$;

-- The caller holds the action's row lock.
CREATE OR REPLACE FUNCTION replaysafe._keep_first_attempt(p_tenant_id text, p_action_key text)
RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    INSERT INTO replaysafe.action_attempts (tenant_id, action_key, attempt, worker_id, claimed_at,
                                            ended_at, outcome, superseded, error, result,
                                            provider_reference, attempt_token_hash)
    SELECT f.tenant_id, f.action_key, f.attempt, f.worker_id, f.claimed_at, f.ended_at, f.outcome,
           f.superseded, f.error, f.result, f.provider_reference, f.attempt_token_hash
    FROM replaysafe._first_attempts f
    WHERE f.tenant_id = p_tenant_id AND f.action_key = p_action_key
    ON CONFLICT DO NOTHING
$$;

-- When the caller's transaction began, in p_now's frame: p_now less the time since the
-- transaction began, once that is more than the 100 ms a statement of its own may take (in
-- autocommit it is p_now itself). A claim or sweep takes over only leases that had expired
-- by then: holding a row lock in a long transaction until a colleague's lease runs out
-- gains nothing.
CREATE OR REPLACE FUNCTION replaysafe._transaction_began(p_now timestamptz)
RETURNS timestamptz
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT p_now - CASE WHEN clock_timestamp() - now() > interval '100 milliseconds'
                        THEN clock_timestamp() - now() ELSE interval '0' END
$$;

-- Claim an action: create it, or find it and answer what the caller must do.
-- Outcomes: claimed | replay | running | unknown; RS001 on a changed fingerprint.
-- A replay or an "unknown" answer reads one row without locking and writes nothing.
-- p_claim_token: a claim that repeats the token of the running attempt (its first answer was
-- lost) answers "claimed" again with that attempt, lease and attempt token while the lease is
-- live. A "claimed" answer carries the attempt's token (see _attempt_token); no other does.
CREATE OR REPLACE FUNCTION replaysafe.claim_action(
    p_tenant_id   text,
    p_action_key  text,
    p_operation   text,
    p_request     jsonb,
    p_worker_id   text,
    p_lease       interval    DEFAULT '30 seconds',
    p_thread_id   text        DEFAULT NULL,
    p_on_expired  text        DEFAULT 'unknown',
    p_now         timestamptz DEFAULT clock_timestamp(),
    p_claim_token text        DEFAULT NULL,
    p_grant       text        DEFAULT NULL)
RETURNS replaysafe.claim_record
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    a            replaysafe.actions;
    v_found      boolean;
    v_secret     bytea;
    v_tokens     bytea;
    v_claim_hash bytea;
    v_token      text;
    v_max        bigint;
    v_digits     bigint;
BEGIN
    IF (octet_length(p_tenant_id) BETWEEN 1 AND 1024 AND length(p_tenant_id) <= 512
        AND octet_length(p_action_key) BETWEEN 1 AND 1024 AND length(p_action_key) <= 512
        AND octet_length(p_operation) BETWEEN 1 AND 1024 AND length(p_operation) <= 512
        AND octet_length(p_worker_id) BETWEEN 1 AND 1024 AND length(p_worker_id) <= 512
        AND (p_thread_id IS NULL
             OR (octet_length(p_thread_id) BETWEEN 1 AND 1024 AND length(p_thread_id) <= 512))
        AND (p_claim_token IS NULL
             OR (octet_length(p_claim_token) <= 1024 AND length(p_claim_token) BETWEEN 22 AND 512)))
       IS NOT TRUE THEN
        PERFORM replaysafe._check_id('p_tenant_id', p_tenant_id);
        PERFORM replaysafe._check_id('p_action_key', p_action_key);
        PERFORM replaysafe._check_id('p_operation', p_operation);
        PERFORM replaysafe._check_id('p_worker_id', p_worker_id);
        PERFORM replaysafe._check_id('p_thread_id', p_thread_id, true);
        PERFORM replaysafe._check_id('p_claim_token', p_claim_token, true);
        IF length(p_claim_token) < 22 THEN
            PERFORM replaysafe._invalid('p_claim_token', 'must be a secret of at least 22 characters '
                                        '(made from at least 128 random bits)');
        END IF;
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
        p_now := replaysafe._check_now(p_now, p_grant);
    END IF;
    -- The tenant check's common case inline: a caller bound to p_tenant_id (_binding), outside
    -- a security-restricted operation, without a grant. Anything else, and any argument with a
    -- COLLATE clause, takes _acts_for's whole path (its answer or its error). Both tests
    -- compare under "C" (see _acts_for).
    IF p_grant IS NOT NULL OR pg_collation_for(p_tenant_id) COLLATE "C" IS DISTINCT FROM '"default"'
       OR (replaysafe._binding() = p_tenant_id COLLATE "C") IS NOT TRUE
       OR replaysafe._in_restricted_operation() THEN
        PERFORM replaysafe._acts_for(p_tenant_id, p_grant, '{worker}');
    END IF;

    IF p_claim_token IS NOT NULL THEN
        v_claim_hash := sha256(convert_to(p_claim_token, 'UTF8'));
    END IF;

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
                a.idempotency_key, a.provider_reference, NULL)::replaysafe.claim_record;
        ELSIF a.state = 'unknown' THEN
            RETURN ('unknown', a.state, a.attempt, a.lease_expires_at, a.result, a.error,
                a.idempotency_key, a.provider_reference, NULL)::replaysafe.claim_record;
        ELSIF a.state = 'running' AND a.claim_token_hash = v_claim_hash
              AND a.lease_expires_at > greatest(p_now, clock_timestamp()) THEN
            -- Our own claim, whose answer was lost: no lock needed, only the token's holder
            -- (who does not know it holds the lease) could move the action on.
            RETURN ('claimed', a.state, a.attempt, a.lease_expires_at, a.result, a.error,
                a.idempotency_key, a.provider_reference,
                replaysafe._attempt_token(p_tenant_id, p_action_key, a.attempt, p_claim_token)
                )::replaysafe.claim_record;
        ELSIF a.state = 'running' AND a.has_waiters
              AND a.lease_expires_at > replaysafe._transaction_began(p_now) THEN
            RETURN ('running', a.state, a.attempt, a.lease_expires_at, a.result, a.error,
                a.idempotency_key, a.provider_reference, NULL)::replaysafe.claim_record;
        END IF;
    ELSE
        -- The key of replaysafe.idempotency_key(), computed here: a query without parameters
        -- keeps one cached plan (with them, every call would be planned anew: ~8 us). The
        -- limits come with the secrets (one read).
        SELECT i.key_secret, i.token_secret, l.request_bytes, l.number_digits
        INTO v_secret, v_tokens, v_max, v_digits
        FROM replaysafe.installation i LEFT JOIN replaysafe.limits l ON true;
        -- A new action: its request keeps the size limits (checked here only: a later claim
        -- compares it with the stored one, whatever the limits are by then).
        IF pg_column_size(p_request) > v_max OR replaysafe._long_number(p_request, v_digits) IS NOT NULL THEN
            PERFORM replaysafe._check_size('p_request', p_request, 'request_bytes', v_max, v_digits);
        END IF;
        a.idempotency_key := 'rs2_' || encode(sha256(v_secret || sha256(v_secret || convert_to(
            length(p_tenant_id)::text || ':' || p_tenant_id || p_action_key, 'UTF8'))), 'hex');
        -- The first attempt's token, as _attempt_token makes it (inline: this is the hot path;
        -- a claim-token retry, which calls _attempt_token, must answer the same token).
        v_token := 'rsat_' || CASE
            WHEN p_claim_token IS NULL
                THEN replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', '')
            ELSE encode(sha256(v_tokens || sha256(v_tokens || convert_to(
                length(p_tenant_id)::text || ':' || p_tenant_id || length(p_action_key)::text
                || ':' || p_action_key || '1:' || p_claim_token, 'UTF8'))), 'hex') END;
        PERFORM replaysafe._durable();
        INSERT INTO replaysafe.actions AS x (
            tenant_id, action_key, thread_id, operation, request, state, attempt, on_expired,
            idempotency_key, worker_id, lease_expires_at, created_at, updated_at,
            claim_token_hash, attempt_token_hash)
        VALUES (
            p_tenant_id, p_action_key, p_thread_id, p_operation, p_request, 'running', 1,
            p_on_expired, a.idempotency_key, p_worker_id,
            p_now + p_lease, p_now, p_now, v_claim_hash, sha256(convert_to(v_token, 'UTF8')))
        ON CONFLICT DO NOTHING
        -- Only what the answer needs (the rest is NULL): a whole row costs a copy.
        RETURNING x.state, x.attempt, x.lease_expires_at, x.idempotency_key
        INTO a.state, a.attempt, a.lease_expires_at, a.idempotency_key;
        IF FOUND THEN
            -- No attempt row: the action row is the record of its first attempt until
            -- something else than that attempt's own report changes it (_keep_first_attempt).
            RETURN ('claimed', a.state, a.attempt, a.lease_expires_at, a.result, a.error,
                a.idempotency_key, a.provider_reference, v_token)::replaysafe.claim_record;
        END IF;
        -- A concurrent claim created it first: decide under its row lock below.
    END IF;

    RETURN replaysafe._claim_locked(p_tenant_id, p_action_key, p_operation, p_request,
                                    p_worker_id, p_lease, p_thread_id, p_on_expired, p_now,
                                    p_claim_token, p_grant);
END
$$;

-- The part of a claim that must change the row: waiters, expired leases, retries. A lease is
-- taken over (reclaimed, or switched to unknown) only when it had expired before the caller's
-- transaction began (_transaction_began).
CREATE OR REPLACE FUNCTION replaysafe._claim_locked(
    p_tenant_id text, p_action_key text, p_operation text, p_request jsonb,
    p_worker_id text, p_lease interval, p_thread_id text, p_on_expired text, p_now timestamptz,
    p_claim_token text, p_grant text)
RETURNS replaysafe.claim_record
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    a          replaysafe.actions;
    v_began    timestamptz := replaysafe._transaction_began(p_now);
    v_token    text;
    v_hash     bytea := CASE WHEN p_claim_token IS NOT NULL
                             THEN sha256(convert_to(p_claim_token, 'UTF8')) END;
BEGIN
    PERFORM replaysafe._durable();
    SELECT * INTO a FROM replaysafe.actions x
    WHERE x.tenant_id = p_tenant_id AND x.action_key = p_action_key
    FOR UPDATE;
    IF NOT FOUND THEN
        -- Purged between our reads (it was terminal): it is new again.
        RETURN replaysafe.claim_action(p_tenant_id, p_action_key, p_operation, p_request,
                                       p_worker_id, p_lease, p_thread_id, p_on_expired, p_now,
                                       p_claim_token, p_grant);
    END IF;
    IF a.operation <> p_operation OR a.request <> p_request THEN
        PERFORM replaysafe._raise('RS001', format(
            'action %s already exists with a different operation or request', p_action_key));
    END IF;

    IF a.state IN ('succeeded', 'failed') THEN
        RETURN ('replay', a.state, a.attempt, a.lease_expires_at, a.result, a.error,
                a.idempotency_key, a.provider_reference, NULL)::replaysafe.claim_record;
    ELSIF a.state = 'unknown' THEN
        RETURN ('unknown', a.state, a.attempt, a.lease_expires_at, a.result, a.error,
                a.idempotency_key, a.provider_reference, NULL)::replaysafe.claim_record;
    ELSIF a.state = 'running' AND a.claim_token_hash = v_hash
              AND a.lease_expires_at > greatest(p_now, clock_timestamp()) THEN
        RETURN ('claimed', a.state, a.attempt, a.lease_expires_at, a.result, a.error,
                a.idempotency_key, a.provider_reference,
                replaysafe._attempt_token(p_tenant_id, p_action_key, a.attempt, p_claim_token)
                )::replaysafe.claim_record;
    ELSIF a.state = 'running' AND a.lease_expires_at > v_began THEN
        IF NOT a.has_waiters THEN
            UPDATE replaysafe.actions x SET has_waiters = true
            WHERE x.tenant_id = p_tenant_id AND x.action_key = p_action_key;
        END IF;
        RETURN ('running', a.state, a.attempt, a.lease_expires_at, a.result, a.error,
                a.idempotency_key, a.provider_reference, NULL)::replaysafe.claim_record;
    ELSIF a.state = 'running' THEN
        -- The lease ran out and nobody noticed yet: the attempt's effect is unknown.
        PERFORM replaysafe._expire_attempt(a, p_now);
        IF a.on_expired = 'unknown' THEN
            UPDATE replaysafe.actions x SET state = 'unknown', updated_at = p_now
            WHERE x.tenant_id = p_tenant_id AND x.action_key = p_action_key
            RETURNING * INTO a;
            RETURN ('unknown', a.state, a.attempt, a.lease_expires_at, a.result, a.error,
                a.idempotency_key, a.provider_reference, NULL)::replaysafe.claim_record;
        END IF;
    END IF;

    -- retryable, or an expired lease under on_expired = 'reclaim': a new attempt.
    IF a.attempt = 1 THEN
        PERFORM replaysafe._keep_first_attempt(p_tenant_id, p_action_key);
    END IF;
    v_token := replaysafe._attempt_token(p_tenant_id, p_action_key, a.attempt + 1, p_claim_token);
    UPDATE replaysafe.actions x
    SET state = 'running', attempt = x.attempt + 1, worker_id = p_worker_id,
        lease_expires_at = p_now + p_lease, has_waiters = false, result = NULL, error = NULL,
        provider_reference = NULL, updated_at = p_now, claim_token_hash = v_hash,
        attempt_token_hash = sha256(convert_to(v_token, 'UTF8'))
    WHERE x.tenant_id = p_tenant_id AND x.action_key = p_action_key
    RETURNING * INTO a;
    INSERT INTO replaysafe.action_attempts (tenant_id, action_key, attempt, worker_id, claimed_at,
                                            attempt_token_hash)
    VALUES (p_tenant_id, p_action_key, a.attempt, p_worker_id, p_now, a.attempt_token_hash);
    RETURN ('claimed', a.state, a.attempt, a.lease_expires_at, a.result, a.error,
                a.idempotency_key, a.provider_reference, v_token)::replaysafe.claim_record;
END
$$;

-- Close an attempt whose lease ran out without a report, and wake its waiters.
-- The caller holds the action's row lock and moves the action out of "running".
CREATE OR REPLACE FUNCTION replaysafe._expire_attempt(a replaysafe.actions, p_now timestamptz)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- A first attempt has no row yet (claim_action): it gets one, from the action row.
    INSERT INTO replaysafe.action_attempts AS t (tenant_id, action_key, attempt, worker_id,
                                                 claimed_at, ended_at, outcome, error,
                                                 attempt_token_hash)
    VALUES (a.tenant_id, a.action_key, a.attempt, a.worker_id, a.created_at, p_now, 'unknown',
            jsonb_build_object('reason', 'lease_expired', 'lease_expires_at', a.lease_expires_at),
            a.attempt_token_hash)
    ON CONFLICT (tenant_id, action_key, attempt) DO UPDATE
    SET outcome = excluded.outcome, ended_at = excluded.ended_at, error = excluded.error;
    -- A NOTIFY fails at commit once the queue is full (any role can fill it): then the
    -- waiters claim again by the lease, as they would for a dead owner.
    IF a.has_waiters AND pg_notification_queue_usage() < 0.5 THEN
        PERFORM pg_notify('replaysafe_actions', a.idempotency_key);
    END IF;
END
$$;

-- Array variant for the parallel tool calls of one model turn: one round trip, results in
-- input order. Keys are claimed in sorted order so two overlapping batches cannot deadlock.
CREATE OR REPLACE FUNCTION replaysafe.claim_actions(
    p_tenant_id   text,
    p_action_keys text[],
    p_operations  text[],
    p_requests    jsonb[],
    p_worker_id   text,
    p_lease       interval    DEFAULT '30 seconds',
    p_thread_id   text        DEFAULT NULL,
    p_on_expired  text        DEFAULT 'unknown',
    p_now         timestamptz DEFAULT clock_timestamp(),
    p_claim_tokens text[]     DEFAULT NULL,
    p_grant       text        DEFAULT NULL)
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
    IF p_claim_tokens IS NOT NULL AND coalesce(cardinality(p_claim_tokens), 0) <> n THEN
        PERFORM replaysafe._invalid('p_claim_tokens', 'must hold one token (or NULL) per key');
    END IF;
    -- Element i of every array belongs to key i: no other bounds, no second dimension.
    IF n > 0 AND (array_ndims(p_action_keys) <> 1 OR array_lower(p_action_keys, 1) <> 1
                  OR array_ndims(p_operations) <> 1 OR array_lower(p_operations, 1) <> 1
                  OR array_ndims(p_requests) <> 1 OR array_lower(p_requests, 1) <> 1
                  OR array_ndims(p_claim_tokens) <> 1 OR array_lower(p_claim_tokens, 1) <> 1) THEN
        PERFORM replaysafe._invalid('p_action_keys', 'p_action_keys, p_operations, p_requests and '
                                    'p_claim_tokens must be one-dimensional arrays indexed from 1');
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
    IF n = 0 THEN  -- no claim_action call to check the tenant (and the grant): here
        PERFORM replaysafe._check_id('p_tenant_id', p_tenant_id);
        PERFORM replaysafe._acts_for(p_tenant_id, p_grant);
    END IF;
    -- Each claim_action call checks its arguments, the tenant (and the grant) and the time.
    FOR i IN SELECT o FROM unnest(p_action_keys) WITH ORDINALITY AS u(k, o) ORDER BY k LOOP
        results[i] := replaysafe.claim_action(p_tenant_id, p_action_keys[i], p_operations[i],
                                              p_requests[i], p_worker_id, p_lease, p_thread_id,
                                              p_on_expired, p_now, p_claim_tokens[i], p_grant);
    END LOOP;
    RETURN QUERY SELECT * FROM unnest(results);
END
$$;

-- The action ledger: what the attempt that holds a lease reports (heartbeats, complete, fail,
-- mark unknown). Each takes the attempt's token (claim_action's answer): a missing one is
-- RS005, one that is not that attempt's is RS004, and in both cases nothing is written, not
-- on the action, not on an attempt row, no wake-up, not even a row lock.

-- The token check of a heartbeat or report that did not find its attempt running: RS004
-- unless p_attempt_token is attempt p_attempt's (read without a lock: an attempt's token hash
-- never changes once written). Returns the action row (NULL when there is none; not checked
-- when it has no attempt p_attempt yet: the callers answer those).
CREATE OR REPLACE FUNCTION replaysafe._check_attempt_token(p_tenant_id text, p_action_key text,
                                                           p_attempt integer, p_hash bytea)
RETURNS replaysafe.actions
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    a        replaysafe.actions;
    v_stored bytea;
BEGIN
    SELECT * INTO a FROM replaysafe.actions x
    WHERE x.tenant_id = p_tenant_id AND x.action_key = p_action_key;
    IF NOT FOUND THEN
        RETURN NULL;
    ELSIF p_attempt > a.attempt THEN
        RETURN a;
    END IF;
    IF p_attempt = a.attempt THEN
        v_stored := a.attempt_token_hash;
    ELSE
        SELECT t.attempt_token_hash INTO v_stored FROM replaysafe.action_attempts t
        WHERE t.tenant_id = p_tenant_id AND t.action_key = p_action_key AND t.attempt = p_attempt;
    END IF;
    IF v_stored IS NULL OR v_stored <> p_hash THEN
        PERFORM replaysafe._raise('RS004', format(
            'access denied: the attempt token is not the token of attempt %s of action %s',
            p_attempt, p_action_key));
    END IF;
    RETURN a;
END
$$;

-- Extends the lease to p_now + p_lease, never shortening it, while the attempt runs. A
-- heartbeat that waited for the row's lock (behind a colleague's open transaction, say) for
-- more than 100 ms counts from when it got it: it never lands a lease that is over already.
CREATE OR REPLACE FUNCTION replaysafe.heartbeat_action(
    p_tenant_id     text,
    p_action_key    text,
    p_attempt       integer,
    p_attempt_token text,
    p_lease         interval    DEFAULT '30 seconds',
    p_now           timestamptz DEFAULT clock_timestamp(),
    p_grant         text        DEFAULT NULL)
RETURNS timestamptz
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_expires timestamptz;
    v_hash    bytea;
    v_sent    timestamptz;
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
    IF p_attempt_token IS NULL OR length(p_attempt_token) NOT BETWEEN 1 AND 512 THEN
        PERFORM replaysafe._invalid('p_attempt_token', 'must be the attempt token of the claim '
                                    '(text of at most 512 characters)');
    END IF;
    v_hash := sha256(convert_to(p_attempt_token, 'UTF8'));
    -- No month part: '1 month -23 days' compares as 7 days but lasts 8 in a 31-day month.
    IF p_lease IS NULL OR p_lease <= interval '0' OR p_lease > interval '7 days'
       OR date_part('month', p_lease) <> 0 OR date_part('year', p_lease) <> 0 THEN
        PERFORM replaysafe._invalid('p_lease', 'must be a positive interval of at most 7 days');
    END IF;
    IF (p_now BETWEEN clock_timestamp() - interval '5 minutes' AND clock_timestamp()) IS NOT TRUE THEN
        p_now := replaysafe._check_now(p_now, p_grant, true);
    END IF;
    -- The tenant check's common case inline: a caller bound to p_tenant_id (_binding), outside
    -- a security-restricted operation, without a grant. Anything else, and any argument with a
    -- COLLATE clause, takes _acts_for's whole path (its answer or its error). Both tests
    -- compare under "C" (see _acts_for).
    IF p_grant IS NOT NULL OR pg_collation_for(p_tenant_id) COLLATE "C" IS DISTINCT FROM '"default"'
       OR (replaysafe._binding() = p_tenant_id COLLATE "C") IS NOT TRUE
       OR replaysafe._in_restricted_operation() THEN
        PERFORM replaysafe._acts_for(p_tenant_id, p_grant, '{worker}', true);
    END IF;

    -- state compared as text: see _report.
    v_sent := clock_timestamp();
    UPDATE replaysafe.actions x
    SET lease_expires_at = greatest(x.lease_expires_at, p_now + p_lease + CASE
            WHEN clock_timestamp() - v_sent > interval '100 milliseconds'
                THEN clock_timestamp() - v_sent ELSE interval '0' END),
        updated_at = p_now
    WHERE x.tenant_id = p_tenant_id AND x.action_key = p_action_key
      AND x.attempt = p_attempt AND x.state::text = 'running' AND x.attempt_token_hash = v_hash
    RETURNING x.lease_expires_at INTO v_expires;
    IF NOT FOUND THEN
        PERFORM replaysafe._check_attempt_token(p_tenant_id, p_action_key, p_attempt, v_hash);
        PERFORM replaysafe._raise('RS002', format(
            'lease lost: attempt %s of action %s no longer holds it', p_attempt, p_action_key));
    END IF;
    RETURN v_expires;
END
$$;

-- The one implementation of an attempt's report (complete, fail, mark unknown).
-- recorded: the action was running under this attempt. late: it is still on this attempt
-- but left running without a final report (expiry, or the attempt said unknown).
-- superseded: a newer attempt or a final outcome exists; kept on the attempt row only, and
-- only while the attempt has no final report (complete or fail) on it: a final report is
-- written once ("unknown", the attempt's own or a lease expiry's, is provisional).
CREATE OR REPLACE FUNCTION replaysafe._report(
    p_tenant_id          text,
    p_action_key         text,
    p_attempt            integer,
    p_attempt_token      text,
    p_state              replaysafe.action_state,
    p_result             jsonb,
    p_error              jsonb,
    p_provider_reference text,
    p_now                timestamptz,
    p_grant              text)
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
    v_hash    bytea;
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
    IF p_attempt_token IS NULL OR length(p_attempt_token) NOT BETWEEN 1 AND 512 THEN
        PERFORM replaysafe._invalid('p_attempt_token', 'must be the attempt token of the claim '
                                    '(text of at most 512 characters)');
    END IF;
    v_hash := sha256(convert_to(p_attempt_token, 'UTF8'));
    IF (p_now BETWEEN clock_timestamp() - interval '5 minutes' AND clock_timestamp()) IS NOT TRUE THEN
        p_now := replaysafe._check_now(p_now, p_grant, true);
    END IF;
    -- The tenant check's common case inline: a caller bound to p_tenant_id (_binding), outside
    -- a security-restricted operation, without a grant. Anything else, and any argument with a
    -- COLLATE clause, takes _acts_for's whole path (its answer or its error). Both tests
    -- compare under "C" (see _acts_for).
    IF p_grant IS NOT NULL OR pg_collation_for(p_tenant_id) COLLATE "C" IS DISTINCT FROM '"default"'
       OR (replaysafe._binding() = p_tenant_id COLLATE "C") IS NOT TRUE
       OR replaysafe._in_restricted_operation() THEN
        PERFORM replaysafe._acts_for(p_tenant_id, p_grant, '{worker}', true);
    END IF;

    PERFORM replaysafe._durable();
    -- Hot path: the attempt still holds the action. The state is compared as text so the
    -- planner cannot pick the partial index of running rows (a walk over every running
    -- lease and every dead entry left since the last vacuum) over the primary key.
    UPDATE replaysafe.actions x
    SET state = p_state, result = p_result, error = p_error,
        provider_reference = p_provider_reference, completed_at = v_final, updated_at = p_now
    WHERE x.tenant_id = p_tenant_id AND x.action_key = p_action_key
      AND x.attempt = p_attempt AND x.state::text = 'running' AND x.attempt_token_hash = v_hash
    RETURNING x.has_waiters, x.idempotency_key INTO a.has_waiters, a.idempotency_key;
    IF FOUND THEN
        v_outcome := 'recorded';
        IF a.has_waiters AND pg_notification_queue_usage() < 0.5 THEN  -- see _expire_attempt
            PERFORM pg_notify('replaysafe_actions', a.idempotency_key);
        END IF;
    ELSE
        -- Nothing, not even a row lock, before the token is known to be the attempt's.
        a := replaysafe._check_attempt_token(p_tenant_id, p_action_key, p_attempt, v_hash);
        IF a.tenant_id IS NULL THEN
            PERFORM replaysafe._raise('RS006', format('action %s does not exist', p_action_key));
        ELSIF p_attempt > a.attempt THEN
            PERFORM replaysafe._raise('RS006', format(
                'action %s has no attempt %s (latest is %s)', p_action_key, p_attempt, a.attempt));
        END IF;
        IF p_attempt = a.attempt THEN
            -- Perhaps late: decided under the action's lock. (An older attempt's report is
            -- superseded for good and changes its own row only: it never locks the action,
            -- which the running attempt's heartbeats and report need.)
            SELECT * INTO a FROM replaysafe.actions x
            WHERE x.tenant_id = p_tenant_id AND x.action_key = p_action_key
            FOR UPDATE;
            IF NOT FOUND THEN  -- purged since
                PERFORM replaysafe._raise('RS006', format('action %s does not exist', p_action_key));
            END IF;
            IF a.attempt = 1 THEN  -- the report below is not the action's: its row keeps what was
                PERFORM replaysafe._keep_first_attempt(p_tenant_id, p_action_key);
            END IF;
        END IF;
        SELECT t.outcome, t.claimed_at INTO v_prior, v_claimed
        FROM replaysafe.action_attempts t
        WHERE t.tenant_id = p_tenant_id AND t.action_key = p_action_key AND t.attempt = p_attempt
        FOR UPDATE;
        IF v_prior IN ('succeeded', 'failed', 'retryable') THEN
            RETURN 'superseded';  -- the attempt's final report is written: nothing changes
        END IF;
        -- Late: still this attempt's action, which left running without a final report from
        -- it (expiry, or its own "unknown"), and no operator has decided it since.
        IF a.attempt = p_attempt AND a.state IN ('unknown', 'retryable')
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

    -- The attempt row keeps the report (it has no final report yet: none, or "unknown").
    UPDATE replaysafe.action_attempts t
    SET outcome = p_state,
        superseded = (v_outcome = 'superseded'),
        ended_at = coalesce(t.ended_at, p_now),
        result = coalesce(p_result, t.result),
        error = coalesce(p_error, t.error),
        provider_reference = coalesce(p_provider_reference, t.provider_reference)
    WHERE t.tenant_id = p_tenant_id AND t.action_key = p_action_key AND t.attempt = p_attempt;
    RETURN v_outcome;
END
$$;

CREATE OR REPLACE FUNCTION replaysafe.complete_action(
    p_tenant_id          text,
    p_action_key         text,
    p_attempt            integer,
    p_attempt_token      text,
    p_result             jsonb,
    p_provider_reference text        DEFAULT NULL,
    p_now                timestamptz DEFAULT clock_timestamp(),
    p_grant              text        DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    l      replaysafe.limits;
    v_over jsonb;
BEGIN
    IF p_result IS NULL THEN
        PERFORM replaysafe._invalid('p_result', 'must not be NULL (use the JSON value null)');
    END IF;
    -- A result over its limits comes after the side effect: refusing it would lose that the
    -- effect happened. The action is recorded "unknown", to be reconciled with the provider;
    -- the error says why, and keeps a provider reference that fits (on the action too).
    SELECT * INTO l FROM replaysafe.limits;
    IF p_provider_reference IS NOT NULL
       AND pg_column_size(p_provider_reference) > l.provider_reference_bytes THEN
        v_over := jsonb_build_object('provider_reference_bytes', pg_column_size(p_provider_reference));
        p_provider_reference := NULL;
    ELSE
        v_over := replaysafe._oversize(p_result, l.result_bytes, l.number_digits);
    END IF;
    IF v_over IS NOT NULL THEN
        RETURN replaysafe._report(p_tenant_id, p_action_key, p_attempt, p_attempt_token, 'unknown',
                                  NULL, jsonb_build_object('reason', 'result_too_large')
                                        || v_over || jsonb_strip_nulls(jsonb_build_object(
                                            'provider_reference', p_provider_reference)),
                                  p_provider_reference, p_now, p_grant);
    END IF;
    RETURN replaysafe._report(p_tenant_id, p_action_key, p_attempt, p_attempt_token, 'succeeded',
                              p_result, NULL, p_provider_reference, p_now, p_grant);
END
$$;

CREATE OR REPLACE FUNCTION replaysafe.fail_action(
    p_tenant_id     text,
    p_action_key    text,
    p_attempt       integer,
    p_attempt_token text,
    p_error         jsonb,
    p_retryable     boolean     DEFAULT false,
    p_now           timestamptz DEFAULT clock_timestamp(),
    p_grant         text        DEFAULT NULL)
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
    PERFORM replaysafe._check_size('p_error', p_error, 'error_bytes', l.error_bytes, l.number_digits)
    FROM replaysafe.limits l;
    RETURN replaysafe._report(p_tenant_id, p_action_key, p_attempt, p_attempt_token,
                              CASE WHEN p_retryable THEN 'retryable' ELSE 'failed' END::replaysafe.action_state,
                              NULL, p_error, NULL, p_now, p_grant);
END
$$;

CREATE OR REPLACE FUNCTION replaysafe.mark_action_unknown(
    p_tenant_id     text,
    p_action_key    text,
    p_attempt       integer,
    p_attempt_token text,
    p_error         jsonb,
    p_now           timestamptz DEFAULT clock_timestamp(),
    p_grant         text        DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_error IS NULL THEN
        PERFORM replaysafe._invalid('p_error', 'must not be NULL');
    END IF;
    PERFORM replaysafe._check_size('p_error', p_error, 'error_bytes', l.error_bytes, l.number_digits)
    FROM replaysafe.limits l;
    RETURN replaysafe._report(p_tenant_id, p_action_key, p_attempt, p_attempt_token, 'unknown',
                              NULL, p_error, NULL, p_now, p_grant);
END
$$;

-- The action ledger: operators' duties (reconciliation, reopening) and the shared machinery
-- (sweeping expired leases, purging old actions).

-- Reconciliation (replaysafe_operator): decide what an unknown action became. With
-- p_expected_attempt, only while the action is still on that attempt (a stale lookup never
-- settles a newer attempt).
CREATE OR REPLACE FUNCTION replaysafe.resolve_action(
    p_tenant_id          text,
    p_action_key         text,
    p_state              text,
    p_result             jsonb       DEFAULT NULL,
    p_error              jsonb       DEFAULT NULL,
    p_provider_reference text        DEFAULT NULL,
    p_note               text        DEFAULT NULL,
    p_now                timestamptz DEFAULT clock_timestamp(),
    p_expected_attempt   integer     DEFAULT NULL,
    p_grant              text        DEFAULT NULL)
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
    IF p_grant IS NULL AND NOT EXISTS (SELECT 1 FROM replaysafe._caller_scope c
                                       WHERE c.owner_or_operator) THEN
        -- EXECUTE is the operators'; a grant to another role by mistake must not open it (with
        -- a tenant grant, the grant's and the role's duties are checked with the tenant).
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
    PERFORM replaysafe._check_size('p_result', p_result, 'result_bytes', l.result_bytes,
                                   l.number_digits),
            replaysafe._check_size('p_error', p_error, 'error_bytes', l.error_bytes,
                                   l.number_digits),
            replaysafe._check_bytes('p_provider_reference', pg_column_size(p_provider_reference),
                                    'provider_reference_bytes', l.provider_reference_bytes)
    FROM replaysafe.limits l;
    IF (p_now BETWEEN clock_timestamp() - interval '5 minutes' AND clock_timestamp()) IS NOT TRUE THEN
        p_now := replaysafe._check_now(p_now, p_grant);
    END IF;
    PERFORM replaysafe._acts_for(p_tenant_id, p_grant, '{operator}');
    PERFORM replaysafe._durable();
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
    IF v_attempt = 1 THEN  -- the attempt's row keeps its own outcome, not the operator's
        PERFORM replaysafe._keep_first_attempt(p_tenant_id, p_action_key);
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
CREATE OR REPLACE FUNCTION replaysafe.reopen_action(
    p_tenant_id  text,
    p_action_key text,
    p_note       text,
    p_now        timestamptz DEFAULT clock_timestamp(),
    p_grant      text        DEFAULT NULL)
RETURNS replaysafe.action_state
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_old replaysafe.action_state;
BEGIN
    IF p_grant IS NULL AND NOT EXISTS (SELECT 1 FROM replaysafe._caller_scope c
                                       WHERE c.owner_or_operator) THEN
        -- EXECUTE is the operators'; a grant to another role by mistake must not open it (with
        -- a tenant grant, the grant's and the role's duties are checked with the tenant).
        PERFORM replaysafe._raise('RS004', 'access denied: settling, reopening and purging are '
                                           'replaysafe_operator''s duty');
    END IF;
    PERFORM replaysafe._check_id('p_tenant_id', p_tenant_id);
    PERFORM replaysafe._check_id('p_action_key', p_action_key);
    IF p_note IS NULL OR p_note = '' THEN
        PERFORM replaysafe._invalid('p_note', 'must say why the action may run again');
    END IF;
    IF (p_now BETWEEN clock_timestamp() - interval '5 minutes' AND clock_timestamp()) IS NOT TRUE THEN
        p_now := replaysafe._check_now(p_now, p_grant);
    END IF;
    PERFORM replaysafe._acts_for(p_tenant_id, p_grant, '{operator}');
    PERFORM replaysafe._durable();

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
    PERFORM replaysafe._keep_first_attempt(p_tenant_id, p_action_key);  -- if it is the first
    UPDATE replaysafe.actions x
    SET state = 'retryable', resolution_note = p_note, resolved_at = p_now, updated_at = p_now,
        completed_at = NULL
    WHERE x.tenant_id = p_tenant_id AND x.action_key = p_action_key;
    RETURN 'retryable';
END
$$;

-- The tenants a sweep or purge acts for: p_tenant_id (or, under a grant, the grant's tenant)
-- when given, which the caller must act for (RS004 otherwise); else the caller's own tenant,
-- or every tenant for the unbound schema owner; else none.
CREATE OR REPLACE FUNCTION replaysafe._sweep_scope(p_tenant_id text, p_grant text, p_duties text[],
                                                   OUT tenant_id text, OUT acts_for_all boolean)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    acts_for_all := false;
    IF p_grant IS NOT NULL THEN
        tenant_id := replaysafe._acts_with_grant(p_tenant_id, p_grant, p_duties) ->> 'tid';
        RETURN;
    END IF;
    IF p_tenant_id IS NOT NULL THEN
        PERFORM replaysafe._check_id('p_tenant_id', p_tenant_id);
        PERFORM replaysafe._acts_for(p_tenant_id);
        tenant_id := p_tenant_id;
        RETURN;
    END IF;
    SELECT c.tenant_id, c.acts_for_all INTO tenant_id, acts_for_all FROM replaysafe._caller_scope c;
END
$$;

-- Expired running leases become unknown (or retryable under on_expired = 'reclaim'), for
-- the caller's tenant (every tenant for the unbound schema owner, or p_tenant_id; under a
-- grant, the grant's tenant: _sweep_scope). Rows locked by a
-- concurrent claim or report are skipped: that caller decides them. As a claim, a sweep
-- takes over only leases that had expired before its transaction began (p_now's frame).
-- The actions an all-tenant sweep (p_began: running leases expired by then) or purge
-- (p_before: terminal actions finished before then) takes in one call, locked, skipping rows
-- another transaction holds (never waiting for them). When at most p_limit are due (the
-- usual case: one probe of the global index) that is all of them. Otherwise round-robin, so
-- one tenant's backlog never starves another's: the tenants with due actions (one index probe
-- per tenant with running, or finished, actions), those whose oldest is oldest first, at most
-- p_limit of them, share p_limit equally (the oldest tenants take the remainder); what their
-- shares leave (a tenant with fewer due, or with rows held elsewhere) goes to the oldest of
-- anyone's.
CREATE OR REPLACE FUNCTION replaysafe._due_actions(p_limit integer, p_began timestamptz,
                                                   p_before timestamptz)
RETURNS TABLE (tenant_id text, action_key text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_tenant  text := '';
    v_oldest  timestamptz;
    v_tenants text[] := '{}';
    v_oldests timestamptz[] := '{}';
    v_keys    text[];
    v_owners  text[];
    v_due     integer;
    n         integer;
BEGIN
    IF p_began IS NOT NULL THEN
        SELECT count(*) INTO v_due FROM (
            SELECT 1 FROM replaysafe.actions x
            WHERE x.state = 'running' AND x.lease_expires_at <= p_began LIMIT p_limit + 1) c;
    ELSE
        SELECT count(*) INTO v_due FROM (
            SELECT 1 FROM replaysafe.actions x
            WHERE x.state IN ('succeeded', 'failed') AND x.completed_at < p_before
            LIMIT p_limit + 1) c;
    END IF;
    IF v_due = 0 THEN
        RETURN;
    END IF;
    IF v_due > p_limit THEN
        LOOP
            -- The next tenant's first entry in the (tenant_id, ...) index: its oldest running
            -- lease, or its oldest finished action.
            IF p_began IS NOT NULL THEN
                SELECT x.tenant_id, x.lease_expires_at INTO v_tenant, v_oldest
                FROM replaysafe.actions x
                WHERE x.state = 'running' AND x.tenant_id > v_tenant
                ORDER BY x.tenant_id, x.lease_expires_at LIMIT 1;
            ELSE
                SELECT x.tenant_id, x.completed_at INTO v_tenant, v_oldest
                FROM replaysafe.actions x
                WHERE x.state IN ('succeeded', 'failed') AND x.tenant_id > v_tenant
                ORDER BY x.tenant_id, x.completed_at LIMIT 1;
            END IF;
            EXIT WHEN NOT FOUND;
            IF v_oldest <= p_began OR v_oldest < p_before THEN
                v_tenants := v_tenants || v_tenant;
                v_oldests := v_oldests || v_oldest;
            END IF;
        END LOOP;
        n := least(cardinality(v_tenants), p_limit);
        IF p_began IS NOT NULL THEN  -- through (tenant_id, lease_expires_at) of running rows
            SELECT array_agg(d.tenant_id), array_agg(d.action_key) INTO v_owners, v_keys
            FROM (SELECT u.tenant_id, row_number() OVER (ORDER BY u.oldest, u.tenant_id) AS i
                  FROM unnest(v_tenants, v_oldests) AS u(tenant_id, oldest)) t
            CROSS JOIN LATERAL (
                SELECT x.tenant_id, x.action_key FROM replaysafe.actions x
                WHERE x.tenant_id = t.tenant_id AND x.state = 'running'
                  AND x.lease_expires_at <= p_began
                ORDER BY x.lease_expires_at
                LIMIT p_limit / n + CASE WHEN t.i <= p_limit % n THEN 1 ELSE 0 END
                FOR UPDATE SKIP LOCKED) d
            WHERE t.i <= n;
        ELSE  -- through (tenant_id, completed_at) of terminal rows
            SELECT array_agg(d.tenant_id), array_agg(d.action_key) INTO v_owners, v_keys
            FROM (SELECT u.tenant_id, row_number() OVER (ORDER BY u.oldest, u.tenant_id) AS i
                  FROM unnest(v_tenants, v_oldests) AS u(tenant_id, oldest)) t
            CROSS JOIN LATERAL (
                SELECT x.tenant_id, x.action_key FROM replaysafe.actions x
                WHERE x.tenant_id = t.tenant_id AND x.state IN ('succeeded', 'failed')
                  AND x.completed_at < p_before
                ORDER BY x.completed_at
                LIMIT p_limit / n + CASE WHEN t.i <= p_limit % n THEN 1 ELSE 0 END
                FOR UPDATE SKIP LOCKED) d
            WHERE t.i <= n;
        END IF;
    END IF;
    -- All that is due, or what the shares left: oldest first.
    IF coalesce(cardinality(v_keys), 0) < p_limit THEN
        IF p_began IS NOT NULL THEN
            SELECT v_owners || array_agg(d.tenant_id), v_keys || array_agg(d.action_key)
            INTO v_owners, v_keys
            FROM (SELECT x.tenant_id, x.action_key FROM replaysafe.actions x
                  WHERE x.state = 'running' AND x.lease_expires_at <= p_began
                    AND (x.tenant_id, x.action_key) NOT IN (
                        SELECT k.t, k.a FROM unnest(v_owners, v_keys) AS k(t, a))
                  ORDER BY x.lease_expires_at
                  LIMIT p_limit - coalesce(cardinality(v_keys), 0) FOR UPDATE SKIP LOCKED) d;
        ELSE
            SELECT v_owners || array_agg(d.tenant_id), v_keys || array_agg(d.action_key)
            INTO v_owners, v_keys
            FROM (SELECT x.tenant_id, x.action_key FROM replaysafe.actions x
                  WHERE x.state IN ('succeeded', 'failed') AND x.completed_at < p_before
                    AND (x.tenant_id, x.action_key) NOT IN (
                        SELECT k.t, k.a FROM unnest(v_owners, v_keys) AS k(t, a))
                  ORDER BY x.completed_at
                  LIMIT p_limit - coalesce(cardinality(v_keys), 0) FOR UPDATE SKIP LOCKED) d;
        END IF;
    END IF;
    RETURN QUERY SELECT k.t, k.a FROM unnest(v_owners, v_keys) AS k(t, a);
END
$$;

CREATE OR REPLACE FUNCTION replaysafe.sweep_expired_actions(
    p_limit     integer     DEFAULT 1000,
    p_now       timestamptz DEFAULT clock_timestamp(),
    p_tenant_id text        DEFAULT NULL,
    p_grant     text        DEFAULT NULL)
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
    v_tenants text[];
    v_actions text[];
    v_began  timestamptz;
BEGIN
    IF p_limit IS NULL OR p_limit < 1 THEN
        PERFORM replaysafe._invalid('p_limit', 'must be a positive integer');
    END IF;
    IF (p_now BETWEEN clock_timestamp() - interval '5 minutes' AND clock_timestamp()) IS NOT TRUE THEN
        p_now := replaysafe._check_now(p_now, p_grant);
    END IF;
    SELECT t.tenant_id, t.acts_for_all INTO v_tenant, v_all
    FROM replaysafe._sweep_scope(p_tenant_id, p_grant, '{worker,operator}') t;
    IF v_tenant IS NULL AND NOT v_all THEN
        RETURN 0;
    END IF;
    v_began := replaysafe._transaction_began(p_now);
    PERFORM replaysafe._durable();

    -- The batch first, locked: through (tenant_id, lease_expires_at) for a tenant's sweep, so it
    -- never walks other tenants' expired leases; through (lease_expires_at) for everyone's.
    IF v_tenant IS NULL THEN
        -- Every tenant's, round-robin (_due_actions).
        SELECT array_agg(d.tenant_id), array_agg(d.action_key) INTO v_tenants, v_actions
        FROM replaysafe._due_actions(p_limit, v_began, NULL) d;
    ELSE
        SELECT array_agg(d.tenant_id), array_agg(d.action_key) INTO v_tenants, v_actions
        FROM (SELECT x.tenant_id, x.action_key FROM replaysafe.actions x
              WHERE x.tenant_id = v_tenant AND x.state = 'running' AND x.lease_expires_at <= v_began
              ORDER BY x.lease_expires_at LIMIT p_limit FOR UPDATE SKIP LOCKED) d;
    END IF;
    IF v_actions IS NULL THEN
        RETURN 0;
    END IF;

    WITH due AS (
        SELECT x.tenant_id, x.action_key, x.attempt, x.on_expired, x.has_waiters,
               x.idempotency_key, x.lease_expires_at, x.worker_id, x.created_at,
               x.attempt_token_hash
        FROM unnest(v_tenants, v_actions) AS k(tenant_id, action_key)
        JOIN replaysafe.actions x ON x.tenant_id = k.tenant_id AND x.action_key = k.action_key
    ), moved AS (
        UPDATE replaysafe.actions x
        SET state = CASE WHEN d.on_expired = 'reclaim' THEN 'retryable' ELSE 'unknown' END::replaysafe.action_state,
            updated_at = p_now
        FROM due d
        WHERE x.tenant_id = d.tenant_id AND x.action_key = d.action_key
        RETURNING x.tenant_id
    ), closed AS (  -- data-modifying CTEs always run to completion; see _expire_attempt
        INSERT INTO replaysafe.action_attempts AS t (tenant_id, action_key, attempt, worker_id,
                                                     claimed_at, ended_at, outcome, error,
                                                     attempt_token_hash)
        SELECT d.tenant_id, d.action_key, d.attempt, d.worker_id, d.created_at, p_now, 'unknown',
               jsonb_build_object('reason', 'lease_expired', 'lease_expires_at', d.lease_expires_at),
               d.attempt_token_hash
        FROM due d
        ON CONFLICT (tenant_id, action_key, attempt) DO UPDATE
        SET outcome = excluded.outcome, ended_at = excluded.ended_at, error = excluded.error
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
-- caller's tenant (every tenant for the unbound schema owner, or p_tenant_id; under a grant,
-- the grant's tenant: _sweep_scope). Batched by p_limit; never
-- touches running, unknown or retryable actions. replaysafe_operator only: once purged, a
-- key would run again.
CREATE OR REPLACE FUNCTION replaysafe.purge_actions(
    p_older_than interval,
    p_limit      integer     DEFAULT 10000,
    p_now        timestamptz DEFAULT clock_timestamp(),
    p_tenant_id  text        DEFAULT NULL,
    p_grant      text        DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_count  integer;
    v_tenant text;
    v_all    boolean;
    v_tenants text[];
    v_actions text[];
BEGIN
    p_now := replaysafe._check_purge(p_older_than, p_limit, p_now, p_grant,
                                     'settling, reopening and purging are');
    SELECT t.tenant_id, t.acts_for_all INTO v_tenant, v_all
    FROM replaysafe._sweep_scope(p_tenant_id, p_grant, '{operator}') t;
    IF v_tenant IS NULL AND NOT v_all THEN
        RETURN 0;
    END IF;

    PERFORM replaysafe._durable();
    -- The batch first, locked: through (tenant_id, completed_at) for a tenant's purge, so it
    -- never walks other tenants' old actions; through (completed_at) for everyone's.
    IF v_tenant IS NULL THEN
        -- Every tenant's, round-robin (_due_actions).
        SELECT array_agg(d.tenant_id), array_agg(d.action_key) INTO v_tenants, v_actions
        FROM replaysafe._due_actions(p_limit, NULL, p_now - p_older_than) d;
    ELSE
        SELECT array_agg(d.tenant_id), array_agg(d.action_key) INTO v_tenants, v_actions
        FROM (SELECT x.tenant_id, x.action_key FROM replaysafe.actions x
              WHERE x.tenant_id = v_tenant AND x.state IN ('succeeded', 'failed')
                AND x.completed_at < p_now - p_older_than
              ORDER BY x.completed_at LIMIT p_limit FOR UPDATE SKIP LOCKED) d;
    END IF;
    -- An attempt row another transaction holds (an old attempt's report in flight, which
    -- locks no action) keeps its action for a later purge: nothing here waits for it.
    SELECT array_agg(v.tenant_id), array_agg(v.action_key) INTO v_tenants, v_actions
    FROM unnest(v_tenants, v_actions) AS v(tenant_id, action_key)
    WHERE (SELECT count(*) FROM replaysafe.action_attempts t
           WHERE t.tenant_id = v.tenant_id AND t.action_key = v.action_key)
        = (SELECT count(*) FROM (SELECT 1 FROM replaysafe.action_attempts t
                                 WHERE t.tenant_id = v.tenant_id AND t.action_key = v.action_key
                                 FOR UPDATE SKIP LOCKED) l);
    IF v_actions IS NULL THEN
        RETURN 0;
    END IF;

    WITH victims AS (
        SELECT k.tenant_id, k.action_key FROM unnest(v_tenants, v_actions) AS k(tenant_id, action_key)
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
-- Tenant grants (docs/isolation.md#tenant-grants): the capability of a pooled login that
-- serves many tenants. An issuer (a member of replaysafe_issuer: the application server,
-- never the agent) signs a grant for one tenant, optionally one user, with duties and an
-- expiry; the tenant-scoped functions take it as p_grant and act for its tenant with the
-- duties both the grant and the login's group roles give.
--
-- The format is a compact JWS (RFC 7515) with HS256: base64url(header) "." base64url(claims)
-- "." base64url(HMAC-SHA256 of the first two parts). The header is fixed per key (it names
-- the key and pins the algorithm) and found by primary key; the claims are a jsonb object
-- built by jsonb_build_object (never by concatenation): iss (the installation and the
-- database's name), tid (tenant), sub (user, when the grant names one), dut (duties), iat and
-- exp (seconds since the epoch, by the database clock), gen (the tenant's revocation
-- generation). Nothing but these functions makes or reads a grant's claims.
-- ---------------------------------------------------------------------------------------

-- base64url without padding (RFC 4648 section 5): encode() wraps base64 lines at 76
-- characters; translate() maps the two letters that differ and drops the padding and
-- the line breaks.
CREATE OR REPLACE FUNCTION replaysafe._base64url(p_bytes bytea)
RETURNS text
LANGUAGE sql IMMUTABLE STRICT
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT translate(encode(p_bytes, 'base64'), E'+/=\n', '-_')
$$;

-- HMAC's two padded keys (RFC 2104): a key longer than SHA-256's 64-byte block is hashed
-- first, a shorter one padded with zeros; then XOR 0x36 (inner) and 0x5c (outer).
CREATE OR REPLACE FUNCTION replaysafe._hmac_pads(p_key bytea, OUT inner_pad bytea, OUT outer_pad bytea)
LANGUAGE sql IMMUTABLE STRICT
SET search_path = pg_catalog, pg_temp
AS $$
    WITH k AS (
        SELECT CASE WHEN length(p_key) > 64 THEN sha256(p_key) ELSE p_key END AS key)
    SELECT decode(string_agg(lpad(to_hex(b.byte # 54), 2, '0'), '' ORDER BY b.i), 'hex'),
           decode(string_agg(lpad(to_hex(b.byte # 92), 2, '0'), '' ORDER BY b.i), 'hex')
    FROM k, LATERAL (SELECT i, CASE WHEN i < length(k.key) THEN get_byte(k.key, i) ELSE 0 END
                     FROM generate_series(0, 63) i) b(i, byte)
$$;

-- HMAC-SHA256 (RFC 2104, RFC 4231) from sha256(): Postgres has no hmac() without pgcrypto.
CREATE OR REPLACE FUNCTION replaysafe._hmac_sha256(p_key bytea, p_message bytea)
RETURNS bytea
LANGUAGE sql IMMUTABLE STRICT
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT sha256(p.outer_pad || sha256(p.inner_pad || p_message))
    FROM replaysafe._hmac_pads(p_key) p
$$;

-- A new signing key: 244 random bits from the server's strong random source, kept as its
-- two pads, with the grant header that names it and the installation that made it. A grant
-- names that installation and the database (its name: a template clone has another; the
-- clone shares the key's row, never the name). Returns its key id.
CREATE OR REPLACE FUNCTION replaysafe._new_grant_key()
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_key_id text := 'rsgk_' || left(replace(gen_random_uuid()::text, '-', ''), 16);
BEGIN
    INSERT INTO replaysafe.grant_keys (header, key_id, issuer, inner_pad, outer_pad)
    SELECT replaysafe._base64url(convert_to(
               jsonb_build_object('alg', 'HS256', 'kid', v_key_id, 'typ', 'JWT')::text, 'UTF8')),
           v_key_id, 'replaysafe:' || i.installation_id::text, p.inner_pad, p.outer_pad
    FROM replaysafe.installation i,
         replaysafe._hmac_pads(decode(replace(gen_random_uuid()::text || gen_random_uuid()::text,
                                              '-', ''), 'hex')) p;
    RETURN v_key_id;
END
$$;

-- The claims of p_grant when the caller may act with it for p_tenant_id (NULL: the grant's
-- own tenant) in one of p_duties; otherwise an error that writes nothing:
--   RS005 when p_grant is not a grant at all (NULL, over 2 KiB, not three base64url parts
--         with a canonical 32-byte signature);
--   RS004 when it is not valid here and now (unknown key, altered, another installation's or
--         database's, expired, revoked), is for another tenant, the session is bound to
--         another tenant (its current role's binding, else its login's: SET ROLE never
--         widens), none of p_duties is both the grant's and the caller's (its group roles;
--         the schema owner has every duty), or inside a security-restricted operation.
-- p_report: a heartbeat or report of an attempt, authorised by its attempt token: a grant that
-- expired while the tool ran does not stop its result from being recorded, for up to 7 days
-- after its expiry (the longest lease; revocation stops it at once).
-- Expiry and revocation are checked against the database clock and the tenant's current
-- generation (one primary-key probe); nothing is cached in the session. One query reads the
-- key (by the grant's header: it pins the algorithm and names the key) and the generation;
-- the signature is compared as the hash
-- of its canonical base64url text (a non-canonical spelling never matches, and the
-- comparison's time says nothing about the expected MAC).
CREATE OR REPLACE FUNCTION replaysafe._acts_with_grant(p_tenant_id text, p_grant text, p_duties text[],
                                                       p_report boolean DEFAULT false)
RETURNS jsonb
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_header     text := split_part(p_grant, '.', 1);
    v_body       text := split_part(p_grant, '.', 2);
    v_inner      bytea;
    v_outer      bytea;
    v_issuer     text;
    v_role       text;
    v_bound      text;
    v_restricted boolean;
    v_generation bigint;
    v_claims     jsonb;
    v_duty       text;
BEGIN
    IF p_grant IS NULL OR octet_length(p_grant) > 2048 THEN
        PERFORM replaysafe._invalid('p_grant', 'must be a tenant grant of at most 2048 bytes '
                                    '(replaysafe.issue_tenant_grant makes them)');
    END IF;
    -- A snapshot older than a revocation or a key rotation would not see it: the keys and the
    -- generations are read with a snapshot of this statement's (READ COMMITTED, or the first
    -- statement of a REPEATABLE READ or SERIALIZABLE transaction, whose snapshot it takes).
    IF current_setting('transaction_isolation') <> 'read committed'
       AND statement_timestamp() <> transaction_timestamp() THEN
        PERFORM replaysafe._raise('RS004', format(
            'access denied: a tenant grant is honoured in READ COMMITTED transactions, and in the '
            'first statement of a %s one only (an older snapshot would not see a revocation)',
            upper(current_setting('transaction_isolation'))));
    END IF;
    -- As in _acts_for: a COLLATE clause on an argument would rule every comparison here.
    IF pg_collation_for(p_tenant_id) COLLATE "C" IS DISTINCT FROM '"default"' THEN
        PERFORM replaysafe._invalid('p_tenant_id', 'the arguments must not carry a COLLATE clause '
                                    '(comparisons use the database''s collation)');
    END IF;
    SELECT k.inner_pad, k.outer_pad, k.issuer || ':' || current_database(),
           (SELECT g.generation FROM replaysafe.grant_generations g
            WHERE g.tenant_id = p_tenant_id)
    INTO v_inner, v_outer, v_issuer, v_generation
    FROM replaysafe.grant_keys k
    WHERE k.header = v_header;
    IF NOT FOUND OR octet_length(p_grant) <> octet_length(v_header) + octet_length(v_body) + 45
       OR sha256(convert_to(translate(encode(sha256(v_outer || sha256(
               v_inner || convert_to(v_header || '.' || v_body, 'UTF8'))), 'base64'), '+/=', '-_'),
               'UTF8'))
           IS DISTINCT FROM sha256(convert_to(split_part(p_grant, '.', 3), 'UTF8')) THEN
        IF p_grant COLLATE "C" !~ '^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]{42}[AEIMQUYcgkosw048]$' THEN
            PERFORM replaysafe._invalid('p_grant', 'must be a tenant grant of at most 2048 bytes '
                                        '(replaysafe.issue_tenant_grant makes them)');
        END IF;
        IF NOT FOUND THEN
            PERFORM replaysafe._raise('RS004', 'access denied: the grant was not signed by a key '
                                      'of this installation (another installation''s, or a '
                                      'retired key)');
        END IF;
        PERFORM replaysafe._raise('RS004', 'access denied: the grant''s signature does not match');
    END IF;
    -- Signed by us: the claims are the text issue_tenant_grant encoded.
    v_claims := convert_from(decode(translate(v_body, '-_', '+/')
                                    || repeat('=', (4 - length(v_body) % 4) % 4), 'base64'),
                             'UTF8')::jsonb;
    IF v_claims ->> 'iss' IS DISTINCT FROM v_issuer THEN
        PERFORM replaysafe._raise('RS004', 'access denied: the grant was issued for another '
                                  'database (a copy of this one, or another installation)');
    END IF;
    -- No grant lives longer than 7 days from its issue, which is not in the future (a grant
    -- made with a leaked key is bounded too).
    IF (v_claims ->> 'exp')::numeric - (v_claims ->> 'iat')::numeric > 604800
       OR (v_claims ->> 'iat')::numeric > extract(epoch FROM clock_timestamp()) + 300 THEN
        PERFORM replaysafe._raise('RS004', 'access denied: the grant''s lifetime is not one this '
                                  'installation issues');
    END IF;
    -- A heartbeat or report may come after its grant expired, within the longest lease.
    IF (v_claims ->> 'exp')::numeric
       <= extract(epoch FROM clock_timestamp()) - (CASE WHEN p_report THEN 604800 ELSE 0 END) THEN
        PERFORM replaysafe._raise('RS004', format('access denied: the grant expired at %s',
                                  to_timestamp((v_claims ->> 'exp')::numeric)));
    END IF;
    IF p_tenant_id IS NULL THEN  -- the grant's own tenant (use_grant, grant_in_force)
        p_tenant_id := v_claims ->> 'tid';
        SELECT g.generation INTO v_generation FROM replaysafe.grant_generations g
        WHERE g.tenant_id = p_tenant_id;
    ELSIF (v_claims ->> 'tid') IS DISTINCT FROM p_tenant_id COLLATE "C" THEN
        PERFORM replaysafe._raise('RS004', 'access denied: the grant is for another tenant');
    END IF;
    IF (v_claims ->> 'gen')::bigint IS DISTINCT FROM coalesce(v_generation, 0) THEN
        PERFORM replaysafe._raise('RS004', 'access denied: the tenant''s grants were revoked '
                                  'after this one was issued');
    END IF;
    SELECT c.role_name, c.tenant_id, c.restricted INTO v_role, v_bound, v_restricted
    FROM replaysafe._caller c;
    IF v_restricted THEN
        PERFORM replaysafe._raise('RS004', 'access denied: this role may not act for that tenant');
    END IF;
    IF v_bound COLLATE "C" <> p_tenant_id COLLATE "C" THEN
        PERFORM replaysafe._raise('RS004', 'access denied: this role is bound to another tenant '
                                  '(a bound session accepts grants for its own tenant only)');
    END IF;
    FOREACH v_duty IN ARRAY p_duties LOOP
        IF (v_claims -> 'dut') ? v_duty
           AND (pg_has_role(v_role, coalesce(to_regrole('replaysafe_' || v_duty)::oid, 0::oid),
                            'USAGE')
                OR to_regrole(quote_ident(v_role))::oid
                   = (SELECT n.nspowner FROM pg_namespace n WHERE n.nspname = 'replaysafe')) THEN
            RETURN v_claims;
        END IF;
    END LOOP;
    PERFORM replaysafe._raise('RS004', format(
        'access denied: this call needs the duty %s, which the grant and this role do not both give',
        array_to_string(p_duties, ' or ')));
    RETURN NULL;
END
$$;

-- A thread function's user under a grant: p_user_id must be the grant's user or omitted
-- (then it is the grant's user). A grant for the whole tenant leaves p_user_id as it is.
CREATE OR REPLACE FUNCTION replaysafe._grant_user(p_grant_user text, p_user_id text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_grant_user IS NULL THEN
        RETURN p_user_id;
    END IF;
    IF p_user_id IS NOT NULL AND p_user_id COLLATE "C" <> p_grant_user COLLATE "C" THEN
        PERFORM replaysafe._raise('RS004', 'access denied: the grant is for another user');
    END IF;
    RETURN p_grant_user;
END
$$;

-- Issue a grant (members of replaysafe_issuer, and the schema owner). An issuer bound to a
-- tenant issues for that tenant only.
CREATE OR REPLACE FUNCTION replaysafe.issue_tenant_grant(
    p_tenant_id text,
    p_ttl       interval DEFAULT '1 hour',
    p_user_id   text     DEFAULT NULL,
    p_duties    text[]   DEFAULT '{worker}')
RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_scope  replaysafe._caller_scope;
    v_now    timestamptz := clock_timestamp();
    v_header text;
    v_inner  bytea;
    v_outer  bytea;
    v_issuer text;
    v_claims text;
    v_grant  text;
BEGIN
    SELECT * INTO v_scope FROM replaysafe._caller_scope;
    IF NOT v_scope.is_owner AND (replaysafe._in_restricted_operation() OR NOT pg_has_role(
           to_regrole(quote_ident(v_scope.role_name))::oid,
           coalesce(to_regrole('replaysafe_issuer')::oid, 0::oid), 'USAGE')) THEN
        PERFORM replaysafe._raise('RS004', 'access denied: only replaysafe_issuer members issue '
                                  'tenant grants');
    END IF;
    PERFORM replaysafe._check_id('p_tenant_id', p_tenant_id);
    PERFORM replaysafe._check_id('p_user_id', p_user_id, true);
    IF pg_collation_for(p_tenant_id) COLLATE "C" IS DISTINCT FROM '"default"' THEN
        PERFORM replaysafe._invalid('p_tenant_id', 'the arguments must not carry a COLLATE clause');
    END IF;
    IF v_scope.tenant_id COLLATE "C" <> p_tenant_id COLLATE "C" THEN
        PERFORM replaysafe._raise('RS004', 'access denied: this issuer is bound to another tenant');
    END IF;
    -- A copy (a template clone, a restore) shares the original's keys: until it has keys of
    -- its own it issues nothing the original could be handed.
    IF (SELECT i.database_oid FROM replaysafe.installation i)
       IS DISTINCT FROM (SELECT d.oid FROM pg_database d WHERE d.datname = current_database()) THEN
        PERFORM replaysafe._raise('RS004', 'access denied: this database is a copy of another (a '
                                  'template clone or a restore) and shares its grant keys: make '
                                  'it an installation of its own first, SELECT '
                                  'replaysafe.rotate_grant_key(p_keep_previous => false)');
    END IF;
    IF p_ttl IS NULL OR p_ttl <= interval '0' OR p_ttl > interval '7 days'
       OR date_part('month', p_ttl) <> 0 OR date_part('year', p_ttl) <> 0 THEN
        PERFORM replaysafe._invalid('p_ttl', 'must be a positive interval of at most 7 days '
                                    'without a month part');
    END IF;
    IF p_duties IS NULL OR cardinality(p_duties) = 0 OR array_position(p_duties, NULL) IS NOT NULL
       OR NOT p_duties <@ ARRAY['worker', 'operator', 'auditor'] THEN
        PERFORM replaysafe._invalid('p_duties', 'must name one or more of worker, operator, auditor');
    END IF;
    FOR i IN 1..2 LOOP
        SELECT k.header, k.inner_pad, k.outer_pad, k.issuer || ':' || current_database()
        INTO v_header, v_inner, v_outer, v_issuer
        FROM replaysafe.grant_keys k ORDER BY k.created_at DESC, k.key_id LIMIT 1;
        EXIT WHEN FOUND;
        PERFORM replaysafe._new_grant_key();  -- the first grant of the installation
    END LOOP;
    v_claims := replaysafe._base64url(convert_to(jsonb_strip_nulls(jsonb_build_object(
        'iss', v_issuer,
        'tid', p_tenant_id,
        'sub', p_user_id,
        'dut', (SELECT jsonb_agg(DISTINCT d ORDER BY d) FROM unnest(p_duties) d),
        'iat', round(extract(epoch FROM v_now), 3),
        -- the TTL in seconds (no month part): the same whatever the session's time zone
        'exp', round(extract(epoch FROM v_now), 3) + extract(epoch FROM p_ttl),
        'gen', coalesce((SELECT g.generation FROM replaysafe.grant_generations g
                         WHERE g.tenant_id = p_tenant_id), 0)))::text, 'UTF8'));
    v_grant := v_header || '.' || v_claims || '.' || replaysafe._base64url(sha256(
        v_outer || sha256(v_inner || convert_to(v_header || '.' || v_claims, 'UTF8'))));
    IF octet_length(v_grant) > 2048 THEN
        PERFORM replaysafe._invalid('p_tenant_id', format(
            'the grant would be %s bytes, over 2048: use shorter tenant and user ids',
            octet_length(v_grant)));
    END IF;
    RETURN v_grant;
END
$$;

-- Invalidate every grant issued for the tenant so far, from the next call on (the schema
-- owner, or an operator of that tenant: bound to it, or presenting a grant for it with the
-- operator duty). Returns the tenant's new generation.
CREATE OR REPLACE FUNCTION replaysafe.revoke_tenant_grants(p_tenant_id text, p_grant text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_generation bigint;
BEGIN
    PERFORM replaysafe._check_id('p_tenant_id', p_tenant_id);
    IF p_grant IS NOT NULL THEN
        PERFORM replaysafe._acts_with_grant(p_tenant_id, p_grant, '{operator}');
    ELSE
        IF NOT EXISTS (SELECT 1 FROM replaysafe._caller_scope c WHERE c.owner_or_operator) THEN
            PERFORM replaysafe._raise('RS004', 'access denied: only the schema owner and '
                                      'replaysafe_operator members revoke grants');
        END IF;
        PERFORM replaysafe._acts_for(p_tenant_id);
    END IF;
    PERFORM replaysafe._durable();
    INSERT INTO replaysafe.grant_generations AS g (tenant_id, generation, revoked_at)
    VALUES (p_tenant_id, 1, clock_timestamp())
    ON CONFLICT (tenant_id) DO UPDATE
    SET generation = g.generation + 1, revoked_at = excluded.revoked_at
    RETURNING g.generation INTO v_generation;
    RETURN v_generation;
END
$$;

-- Rotate the signing key (owner only): a new key signs from now on; the one it replaces
-- still verifies the grants it signed (they expire within 7 days), every older key is
-- dropped with its grants. p_keep_previous => false drops every other key at once (a key
-- that leaked, or a copy of the database that must stop sharing the original's keys):
-- every grant issued so far is refused from the next call on, and the database becomes an
-- installation of its own (a new installation id, recorded as made here).
CREATE OR REPLACE FUNCTION replaysafe.rotate_grant_key(p_keep_previous boolean DEFAULT true)
RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_key_id text;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM replaysafe._caller_scope c WHERE c.is_owner) THEN
        PERFORM replaysafe._raise('RS004', 'access denied: only the schema owner rotates the grant key');
    END IF;
    IF p_keep_previous IS NULL THEN
        PERFORM replaysafe._invalid('p_keep_previous', 'must not be NULL');
    END IF;
    PERFORM replaysafe._durable();
    LOCK TABLE replaysafe.grant_keys IN EXCLUSIVE MODE;
    DELETE FROM replaysafe.grant_keys k
    WHERE NOT p_keep_previous
       OR k.key_id <> (SELECT n.key_id FROM replaysafe.grant_keys n
                       ORDER BY n.created_at DESC, n.key_id LIMIT 1);
    IF NOT p_keep_previous THEN
        UPDATE replaysafe.installation i
        SET installation_id = gen_random_uuid(),
            database_oid = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database());
    END IF;
    v_key_id := replaysafe._new_grant_key();
    RETURN v_key_id;
END
$$;

-- Make the views honour a grant for the rest of the current transaction (the functions take
-- it as p_grant instead). What is put in force is the grant sealed to this transaction (its
-- backend and start time, MACed with the installation's token secret): a session-level SET
-- of the setting, or a seal copied into another transaction, is honoured by nobody, and
-- every read re-verifies the grant itself (grant_in_force).
CREATE OR REPLACE FUNCTION replaysafe.use_grant(p_grant text)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_claims jsonb;
BEGIN
    IF p_grant IS NULL THEN
        PERFORM replaysafe._invalid('p_grant', 'must not be NULL');
    END IF;
    PERFORM replaysafe._acts_with_grant(NULL, p_grant, '{worker,operator,auditor}');
    PERFORM set_config('replaysafe.grant', replaysafe._grant_seal(p_grant) || '.' || p_grant, true);
END
$$;

CREATE OR REPLACE FUNCTION replaysafe._grant_seal(p_grant text)
RETURNS text
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT encode(sha256(i.token_secret || sha256(i.token_secret || convert_to(
        'grant:' || pg_backend_pid()::text || ':'
        || (extract(epoch FROM now()) * 1000000)::bigint::text || ':' || p_grant, 'UTF8'))), 'hex')
    FROM replaysafe.installation i
$$;

-- The grant use_grant put in force in this transaction, re-verified: its tenant and user
-- (no row when none is in force). The views call it (so every replaysafe role may).
CREATE OR REPLACE FUNCTION replaysafe.grant_in_force(OUT tenant_id text, OUT user_id text)
RETURNS SETOF record
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_value  text := current_setting('replaysafe.grant', true);
    v_grant  text;
    v_claims jsonb;
BEGIN
    IF v_value IS NULL OR v_value = '' OR length(v_value) < 66 THEN
        RETURN;
    END IF;
    v_grant := substr(v_value, 66);
    IF left(v_value, 64) COLLATE "C" <> replaysafe._grant_seal(v_grant) COLLATE "C" THEN
        RETURN;  -- not put in force by use_grant in this transaction
    END IF;
    v_claims := replaysafe._acts_with_grant(NULL, v_grant, '{worker,operator,auditor}');
    tenant_id := v_claims ->> 'tid';
    user_id := v_claims ->> 'sub';
    RETURN NEXT;
END
$$;

-- ---------------------------------------------------------------------------------------
-- Versioned thread state: compare-and-swap writes, bounded history, ownership by user id,
-- tombstones that keep the version counter. Under a tenant grant that names a user,
-- p_user_id is that user (or omitted) and only that user's own threads are reachable (not
-- the tenant's shared ones).
-- ---------------------------------------------------------------------------------------

-- Slow path of the thread functions' argument check: name the offending argument.
CREATE OR REPLACE FUNCTION replaysafe._check_thread_args(p_tenant_id text, p_thread_id text, p_user_id text)
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
CREATE OR REPLACE FUNCTION replaysafe._deny_thread()
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM replaysafe._raise('RS004', 'access denied: this user may not use that thread');
END
$$;

CREATE OR REPLACE FUNCTION replaysafe._stale_thread(p_thread_id text, p_expected bigint, p_current bigint)
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
CREATE OR REPLACE FUNCTION replaysafe.read_thread(
    p_tenant_id text,
    p_thread_id text,
    p_user_id   text DEFAULT NULL,
    p_grant     text DEFAULT NULL)
RETURNS SETOF replaysafe.thread_record
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t            replaysafe.threads;
    r            replaysafe.thread_record;
    v_grant_user text;
BEGIN
    IF (octet_length(p_tenant_id) BETWEEN 1 AND 1024 AND length(p_tenant_id) <= 512
        AND octet_length(p_thread_id) BETWEEN 1 AND 1024 AND length(p_thread_id) <= 512
        AND (p_user_id IS NULL
             OR (octet_length(p_user_id) BETWEEN 1 AND 1024 AND length(p_user_id) <= 512)))
       IS NOT TRUE THEN
        PERFORM replaysafe._check_thread_args(p_tenant_id, p_thread_id, p_user_id);
    END IF;
    -- The tenant check's common case inline: a caller bound to p_tenant_id (_binding), outside
    -- a security-restricted operation, without a grant. Anything else, and any argument with a
    -- COLLATE clause, takes _acts_for's whole path (its answer or its error). Both tests
    -- compare under "C" (see _acts_for).
    IF p_grant IS NOT NULL OR pg_collation_for(p_tenant_id) COLLATE "C" IS DISTINCT FROM '"default"'
       OR (replaysafe._binding() = p_tenant_id COLLATE "C") IS NOT TRUE
       OR replaysafe._in_restricted_operation() THEN
        v_grant_user := replaysafe._acts_for(p_tenant_id, p_grant);
    END IF;
    IF p_grant IS NOT NULL THEN
        p_user_id := replaysafe._grant_user(v_grant_user, p_user_id);
    END IF;

    SELECT * INTO t FROM replaysafe.threads x
    WHERE x.tenant_id = p_tenant_id AND x.thread_id = p_thread_id;
    IF NOT FOUND THEN
        r.version := 0;
        RETURN NEXT r;
        RETURN;
    END IF;
    IF (t.user_id IS NOT NULL OR v_grant_user IS NOT NULL) AND t.user_id IS DISTINCT FROM p_user_id THEN
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
CREATE OR REPLACE FUNCTION replaysafe.write_thread(
    p_tenant_id        text,
    p_thread_id        text,
    p_expected_version bigint,
    p_state            jsonb,
    p_user_id          text    DEFAULT NULL,
    p_history_limit    integer DEFAULT NULL,
    p_grant            text    DEFAULT NULL)
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
    v_grant_user text;
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
    PERFORM replaysafe._check_size('p_state', p_state, 'thread_state_bytes', l.thread_state_bytes,
                                   l.number_digits)
    FROM replaysafe.limits l;
    IF p_history_limit < 1 THEN
        PERFORM replaysafe._invalid('p_history_limit',
            'must be a positive number of versions (got ' || p_history_limit || ')');
    END IF;
    -- The tenant check's common case inline: a caller bound to p_tenant_id (_binding), outside
    -- a security-restricted operation, without a grant. Anything else, and any argument with a
    -- COLLATE clause, takes _acts_for's whole path (its answer or its error). Both tests
    -- compare under "C" (see _acts_for).
    IF p_grant IS NOT NULL OR pg_collation_for(p_tenant_id) COLLATE "C" IS DISTINCT FROM '"default"'
       OR (replaysafe._binding() = p_tenant_id COLLATE "C") IS NOT TRUE
       OR replaysafe._in_restricted_operation() THEN
        v_grant_user := replaysafe._acts_for(p_tenant_id, p_grant);
    END IF;
    IF p_grant IS NOT NULL THEN
        p_user_id := replaysafe._grant_user(v_grant_user, p_user_id);
    END IF;

    PERFORM replaysafe._durable();
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
    IF FOUND AND (t.user_id IS NOT NULL OR v_grant_user IS NOT NULL) AND t.user_id IS DISTINCT FROM p_user_id THEN
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
CREATE OR REPLACE FUNCTION replaysafe.thread_history(
    p_tenant_id text,
    p_thread_id text,
    p_user_id   text    DEFAULT NULL,
    p_limit     integer DEFAULT 100,
    p_grant     text    DEFAULT NULL)
RETURNS TABLE (version bigint, state jsonb, created_at timestamptz)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_owner      text;
    v_grant_user text;
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
    v_grant_user := replaysafe._acts_for(p_tenant_id, p_grant);
    IF p_grant IS NOT NULL THEN
        p_user_id := replaysafe._grant_user(v_grant_user, p_user_id);
    END IF;

    SELECT t.user_id INTO v_owner FROM replaysafe.threads t
    WHERE t.tenant_id = p_tenant_id AND t.thread_id = p_thread_id;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF (v_owner IS NOT NULL OR v_grant_user IS NOT NULL) AND v_owner IS DISTINCT FROM p_user_id THEN
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
CREATE OR REPLACE FUNCTION replaysafe.delete_thread(
    p_tenant_id text,
    p_thread_id text,
    p_user_id   text DEFAULT NULL,
    p_grant     text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t            replaysafe.threads;
    v_grant_user text;
BEGIN
    IF (octet_length(p_tenant_id) BETWEEN 1 AND 1024 AND length(p_tenant_id) <= 512
        AND octet_length(p_thread_id) BETWEEN 1 AND 1024 AND length(p_thread_id) <= 512
        AND (p_user_id IS NULL
             OR (octet_length(p_user_id) BETWEEN 1 AND 1024 AND length(p_user_id) <= 512)))
       IS NOT TRUE THEN
        PERFORM replaysafe._check_thread_args(p_tenant_id, p_thread_id, p_user_id);
    END IF;
    v_grant_user := replaysafe._acts_for(p_tenant_id, p_grant);
    IF p_grant IS NOT NULL THEN
        p_user_id := replaysafe._grant_user(v_grant_user, p_user_id);
    END IF;

    PERFORM replaysafe._durable();
    -- Ownership first, without a lock: a refused caller must not block the owner.
    SELECT * INTO t FROM replaysafe.threads x
    WHERE x.tenant_id = p_tenant_id AND x.thread_id = p_thread_id;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF (t.user_id IS NOT NULL OR v_grant_user IS NOT NULL) AND t.user_id IS DISTINCT FROM p_user_id THEN
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
-- LangGraph checkpoints (replaysafe_pg.langgraph, docs/langgraph.md): one function per
-- method of a LangGraph checkpointer. Channel values are stored once per (channel, version)
-- in langgraph_blobs; a checkpoint row holds the rest. The newest checkpoint of a thread and
-- namespace (its head) is the one put stored last, kept on its langgraph_namespaces row (not
-- the greatest id: an id made on a host whose clock lags sorts below its parent). Under a
-- tenant grant that names a user, only that user's threads are reachable (a thread becomes
-- theirs when they store into it first: _langgraph_user_thread). A
-- checkpoint written by the run loop (metadata source "input" or "loop") whose parent is not
-- the head is refused: two runs on one thread cannot fork it silently.
-- ---------------------------------------------------------------------------------------

-- Slow path of the argument checks: name the offending argument.
CREATE OR REPLACE FUNCTION replaysafe._langgraph_check_args(p_tenant_id text, p_thread_id text,
                                                 p_checkpoint_ns text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM replaysafe._check_id('p_tenant_id', p_tenant_id);
    PERFORM replaysafe._check_id('p_thread_id', p_thread_id);
    IF p_checkpoint_ns IS NULL OR length(p_checkpoint_ns) > 512
       OR octet_length(p_checkpoint_ns) > 1024 THEN
        PERFORM replaysafe._invalid('p_checkpoint_ns',
            'must be text of at most 512 characters and 1024 bytes');
    END IF;
END
$$;

-- RS005 unless the key columns of every row a call would store (thread, namespace,
-- checkpoint and task ids, channel and version: p_fixed bytes, plus element i of p_parts and
-- of p_more for each i) take at most p_max bytes (langgraph_key_bytes) together, and, with
-- the tenant id's p_tenant bytes, fit a primary key's index row (2,704 bytes less the row's
-- headers): over that, random ids do not compress and Postgres refuses the row (54000).
CREATE OR REPLACE FUNCTION replaysafe._langgraph_check_keys(p_tenant bigint, p_max bigint,
                                                            p_fixed bigint,
                                                            p_parts text[] DEFAULT '{}',
                                                            p_more text[] DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_bytes bigint := p_fixed;
BEGIN
    IF cardinality(p_parts) > 0 THEN
        SELECT p_fixed + max(octet_length(a.part) + coalesce(octet_length(a.more), 0)) INTO v_bytes
        FROM unnest(p_parts, p_more) AS a(part, more);
    END IF;
    IF v_bytes > p_max THEN
        PERFORM replaysafe._invalid('p_thread_id',
            'the thread, namespace, checkpoint and task ids and channel of a row take '
            || v_bytes || ' bytes together, over the limit of ' || p_max
            || ' bytes (replaysafe.limits langgraph_key_bytes)');
    ELSIF v_bytes + p_tenant > 2600 THEN
        PERFORM replaysafe._invalid('p_tenant_id',
            'the tenant id and the ids of a row take ' || (v_bytes + p_tenant)
            || ' bytes together, over the 2600 bytes an index row holds');
    END IF;
END
$$;

-- RS005 unless every blob takes at most p_max bytes (stored size); p_limit names its limit.
CREATE OR REPLACE FUNCTION replaysafe._langgraph_check_blobs(p_name text, p_blobs bytea[],
                                                             p_limit text, p_max bigint)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF cardinality(p_blobs) > 0 THEN
        PERFORM replaysafe._check_bytes(p_name, (SELECT max(pg_column_size(b)) FROM unnest(p_blobs) b),
                                        p_limit, p_max);
    END IF;
END
$$;

-- Hold a LangGraph thread for this transaction: its langgraph_threads row FOR KEY SHARE (made
-- first if the thread is new). A writer that creates a namespace (put, put_writes) and a copy
-- (on both its threads) hold it until they commit; a writer into an existing namespace holds
-- that namespace's row instead. So purge_threads (FOR UPDATE SKIP LOCKED on both) skips a
-- thread one of them is writing, also into a namespace no snapshot shows yet, and
-- langgraph_delete_thread (FOR UPDATE on both) waits for them. Row locks of tables only these
-- functions reach: no other role can take them, or see whose they are.
CREATE OR REPLACE FUNCTION replaysafe._langgraph_hold_thread(p_tenant_id text, p_thread_id text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM 1 FROM replaysafe.langgraph_threads t
    WHERE t.tenant_id = p_tenant_id AND t.thread_id = p_thread_id
    FOR KEY SHARE;
    IF NOT FOUND THEN
        INSERT INTO replaysafe.langgraph_threads (tenant_id, thread_id)
        VALUES (p_tenant_id, p_thread_id)
        ON CONFLICT DO NOTHING;
        PERFORM 1 FROM replaysafe.langgraph_threads t
        WHERE t.tenant_id = p_tenant_id AND t.thread_id = p_thread_id
        FOR KEY SHARE;
    END IF;
END
$$;

-- Under a tenant grant that names a user (p_user_id), the thread must be that user's: RS004
-- for another user's thread and for one of the whole tenant (made without such a grant).
-- p_claim: a thread that has nothing stored yet becomes the user's (a put, pending writes,
-- a copy's target). A thread that does not exist is no refusal for a read (it reads nothing).
CREATE OR REPLACE FUNCTION replaysafe._langgraph_user_thread(p_tenant_id text, p_thread_id text,
                                                             p_user_id text, p_claim boolean)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_owner text;
BEGIN
    IF p_user_id IS NULL THEN
        RETURN;
    END IF;
    FOR i IN 1..2 LOOP
        SELECT u.user_id INTO v_owner FROM replaysafe.langgraph_thread_users u
        WHERE u.tenant_id = p_tenant_id AND u.thread_id = p_thread_id;
        IF FOUND THEN
            IF v_owner COLLATE "C" <> p_user_id COLLATE "C" THEN
                PERFORM replaysafe._deny_thread();
            END IF;
            RETURN;
        END IF;
        IF EXISTS (SELECT 1 FROM replaysafe.langgraph_namespaces n
                   WHERE n.tenant_id = p_tenant_id AND n.thread_id = p_thread_id) THEN
            PERFORM replaysafe._deny_thread();  -- the whole tenant's thread
        END IF;
        IF NOT p_claim THEN
            RETURN;
        END IF;
        INSERT INTO replaysafe.langgraph_thread_users (tenant_id, thread_id, user_id)
        VALUES (p_tenant_id, p_thread_id, p_user_id)
        ON CONFLICT DO NOTHING;
        IF FOUND THEN
            RETURN;
        END IF;
        -- A concurrent claim made it someone's first: look again.
    END LOOP;
END
$$;

-- Lock the namespace row (created on first use) and return the ids it refused: exclusive for
-- a checkpoint write, shared for pending writes (they may go on concurrently).
CREATE OR REPLACE FUNCTION replaysafe._langgraph_namespace(p_tenant_id text, p_thread_id text,
                                                p_checkpoint_ns text, p_exclusive boolean)
RETURNS text[]
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_refused text[];
BEGIN
    FOR i IN 1..2 LOOP
        IF p_exclusive THEN
            SELECT n.refused INTO v_refused FROM replaysafe.langgraph_namespaces n
            WHERE n.tenant_id = p_tenant_id AND n.thread_id = p_thread_id
              AND n.checkpoint_ns = p_checkpoint_ns
            FOR NO KEY UPDATE;
        ELSE
            SELECT n.refused INTO v_refused FROM replaysafe.langgraph_namespaces n
            WHERE n.tenant_id = p_tenant_id AND n.thread_id = p_thread_id
              AND n.checkpoint_ns = p_checkpoint_ns
            FOR SHARE;
        END IF;
        IF FOUND THEN
            RETURN v_refused;
        END IF;
        -- A new namespace: no row of it yet that a delete or purge could lock, so the thread's
        -- lock row is held instead (_langgraph_hold_thread).
        PERFORM replaysafe._langgraph_hold_thread(p_tenant_id, p_thread_id);
        INSERT INTO replaysafe.langgraph_namespaces (tenant_id, thread_id, checkpoint_ns)
        VALUES (p_tenant_id, p_thread_id, p_checkpoint_ns)
        ON CONFLICT DO NOTHING;
    END LOOP;
    RETURN v_refused;
END
$$;

-- The head of a namespace: p_head (read from its row) while that checkpoint exists, else the
-- greatest id (the head was deleted since: delete_for_runs). NULL when it has no checkpoint.
CREATE OR REPLACE FUNCTION replaysafe._langgraph_head(p_tenant_id text, p_thread_id text,
                                           p_checkpoint_ns text, p_head text)
RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_head IS NOT NULL AND EXISTS (
           SELECT 1 FROM replaysafe.langgraph_checkpoints c
           WHERE c.tenant_id = p_tenant_id AND c.thread_id = p_thread_id
             AND c.checkpoint_ns = p_checkpoint_ns AND c.checkpoint_id = p_head) THEN
        RETURN p_head;
    END IF;
    RETURN (SELECT c.checkpoint_id FROM replaysafe.langgraph_checkpoints c
            WHERE c.tenant_id = p_tenant_id AND c.thread_id = p_thread_id
              AND c.checkpoint_ns = p_checkpoint_ns
            ORDER BY c.checkpoint_id DESC
            LIMIT 1);
END
$$;

-- Blobs of a namespace that no remaining checkpoint refers to.
CREATE OR REPLACE FUNCTION replaysafe._langgraph_collect_blobs(p_tenant_id text, p_thread_id text,
                                                    p_checkpoint_ns text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    DELETE FROM replaysafe.langgraph_blobs b
    WHERE b.tenant_id = p_tenant_id AND b.thread_id = p_thread_id
      AND b.checkpoint_ns = p_checkpoint_ns
      AND NOT EXISTS (
          SELECT 1 FROM replaysafe.langgraph_checkpoints c
          WHERE c.tenant_id = p_tenant_id AND c.thread_id = p_thread_id
            AND c.checkpoint_ns = p_checkpoint_ns
            AND (c.checkpoint -> 'channel_versions') ->> b.channel = b.version);
END
$$;

-- Store a checkpoint and the channel values new in it (p_channels, p_versions, p_types,
-- p_blobs: parallel arrays; a value already stored at that version is kept) and make it the
-- head of its thread and namespace (a checkpoint stored again keeps the head where it is).
-- A checkpoint of the run loop (metadata source "input" or "loop") is refused, and nothing
-- is stored, when its parent is not the head, or when it has no parent, the namespace has
-- checkpoints and it is a run's first (step -1) or records a run's work (versions_seen names
-- a task besides "__input__": its run began on an empty namespace); its pending writes are
-- dropped, now and when they arrive later. Branching on purpose (source "fork" or "update")
-- is never refused. p_history_limit: checkpoints kept per thread and namespace.
CREATE OR REPLACE FUNCTION replaysafe.langgraph_put(
    p_tenant_id     text,
    p_thread_id     text,
    p_checkpoint_ns text,
    p_checkpoint_id text,
    p_parent_id     text,
    p_checkpoint    jsonb,
    p_metadata      jsonb,
    p_channels      text[]  DEFAULT '{}',
    p_versions      text[]  DEFAULT '{}',
    p_types         text[]  DEFAULT '{}',
    p_blobs         bytea[] DEFAULT '{}',
    p_history_limit integer DEFAULT NULL,
    p_grant         text    DEFAULT NULL)
RETURNS replaysafe.langgraph_put_record
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_user    text;
    v_refused text[];
    v_head    text;
    v_old     record;
    v_text    text;
    v_bad     boolean := false;
    v_fast    boolean := false;
    r         replaysafe.langgraph_put_record;
    l         replaysafe.limits;
BEGIN
    IF (octet_length(p_tenant_id) BETWEEN 1 AND 1024 AND length(p_tenant_id) <= 512
        AND octet_length(p_thread_id) BETWEEN 1 AND 1024 AND length(p_thread_id) <= 512
        AND octet_length(p_checkpoint_ns) <= 1024 AND length(p_checkpoint_ns) <= 512)
       IS NOT TRUE THEN
        PERFORM replaysafe._langgraph_check_args(p_tenant_id, p_thread_id, p_checkpoint_ns);
    END IF;
    IF (octet_length(p_checkpoint_id) BETWEEN 1 AND 1024 AND length(p_checkpoint_id) <= 512
        AND (p_parent_id IS NULL
             OR (octet_length(p_parent_id) BETWEEN 1 AND 1024 AND length(p_parent_id) <= 512)))
       IS NOT TRUE THEN
        PERFORM replaysafe._check_id('p_checkpoint_id', p_checkpoint_id);
        PERFORM replaysafe._check_id('p_parent_id', p_parent_id, true);
    END IF;
    IF p_checkpoint IS NULL OR jsonb_typeof(p_checkpoint) <> 'object' THEN
        PERFORM replaysafe._invalid('p_checkpoint', 'must be a JSON object');
    END IF;
    -- Every read of the checkpoint walks its channel_versions as an object.
    IF p_checkpoint ? 'channel_versions'
       AND jsonb_typeof(p_checkpoint -> 'channel_versions') <> 'object' THEN
        PERFORM replaysafe._invalid('p_checkpoint', 'channel_versions must be a JSON object');
    END IF;
    IF p_metadata IS NULL OR jsonb_typeof(p_metadata) <> 'object' THEN
        PERFORM replaysafe._invalid('p_metadata', 'must be a JSON object');
    END IF;
    SELECT * INTO l FROM replaysafe.limits;
    PERFORM replaysafe._check_size('p_checkpoint', p_checkpoint, 'checkpoint_bytes',
                                   l.checkpoint_bytes, l.number_digits);
    PERFORM replaysafe._check_size('p_metadata', p_metadata, 'checkpoint_bytes',
                                   l.checkpoint_bytes, l.number_digits);
    IF p_channels IS NULL OR p_versions IS NULL OR p_types IS NULL OR p_blobs IS NULL
       OR cardinality(p_versions) <> cardinality(p_channels)
       OR cardinality(p_types) <> cardinality(p_channels)
       OR cardinality(p_blobs) <> cardinality(p_channels) THEN
        PERFORM replaysafe._invalid('p_channels',
            'p_channels, p_versions, p_types and p_blobs must be arrays of one length');
    END IF;
    -- Channels and versions are bounded like ids (they are keys of langgraph_blobs); a blob
    -- is NULL only for a channel emptied at this version.
    -- Loops of simple expressions rather than a query over the arrays (a few channels).
    FOREACH v_text IN ARRAY p_channels LOOP
        v_bad := v_bad OR (octet_length(v_text) BETWEEN 1 AND 1024
                           AND length(v_text) <= 512) IS NOT TRUE;
    END LOOP;
    FOREACH v_text IN ARRAY p_versions LOOP
        v_bad := v_bad OR (octet_length(v_text) BETWEEN 1 AND 1024
                           AND length(v_text) <= 512) IS NOT TRUE;
    END LOOP;
    FOREACH v_text IN ARRAY p_types LOOP
        v_bad := v_bad OR (octet_length(v_text) BETWEEN 1 AND 1024) IS NOT TRUE;
    END LOOP;
    IF v_bad THEN
        PERFORM replaysafe._invalid('p_channels',
            'every channel, version and type must be non-empty text of at most 512 characters '
            'and 1024 bytes');
    END IF;
    PERFORM replaysafe._langgraph_check_keys(octet_length(p_tenant_id), l.langgraph_key_bytes,
                                             octet_length(p_thread_id) + octet_length(p_checkpoint_ns)
                                             + octet_length(p_checkpoint_id));
    PERFORM replaysafe._langgraph_check_keys(octet_length(p_tenant_id), l.langgraph_key_bytes,
                                             octet_length(p_thread_id) + octet_length(p_checkpoint_ns),
                                             p_channels, p_versions);
    PERFORM replaysafe._langgraph_check_blobs('p_blobs', p_blobs, 'blob_bytes', l.blob_bytes);
    IF p_history_limit < 1 THEN
        PERFORM replaysafe._invalid('p_history_limit',
            'must be a positive number of checkpoints (got ' || p_history_limit || ')');
    END IF;
    -- The tenant check's common case inline: a caller bound to p_tenant_id (_binding), outside
    -- a security-restricted operation, without a grant. Anything else, and any argument with a
    -- COLLATE clause, takes _acts_for's whole path (its answer or its error). Both tests
    -- compare under "C" (see _acts_for).
    IF p_grant IS NOT NULL OR pg_collation_for(p_tenant_id) COLLATE "C" IS DISTINCT FROM '"default"'
       OR (replaysafe._binding() = p_tenant_id COLLATE "C") IS NOT TRUE
       OR replaysafe._in_restricted_operation() THEN
        v_user := replaysafe._acts_for(p_tenant_id, p_grant);
    END IF;
    -- A user's writer holds its thread before the owner check: a delete or purge that takes the
    -- thread meanwhile is waited for, and the check then sees what it left.
    IF v_user IS NOT NULL THEN
        PERFORM replaysafe._langgraph_hold_thread(p_tenant_id, p_thread_id);
    END IF;
    PERFORM replaysafe._langgraph_user_thread(p_tenant_id, p_thread_id, v_user, true);
    PERFORM replaysafe._durable();

    -- A put whose parent is the head (a run continuing: the common case) takes the
    -- namespace's lock by moving the head; no fork is possible, so no further reads.
    IF p_parent_id IS NOT NULL THEN
        UPDATE replaysafe.langgraph_namespaces n
        SET head = p_checkpoint_id, written_at = clock_timestamp()
        WHERE n.tenant_id = p_tenant_id AND n.thread_id = p_thread_id
          AND n.checkpoint_ns = p_checkpoint_ns AND n.head = p_parent_id;
        v_fast := FOUND;
    END IF;

    IF NOT v_fast THEN
        -- The namespace's lock (inline: the common case, a namespace already written to).
        SELECT n.refused, n.head INTO v_refused, v_head FROM replaysafe.langgraph_namespaces n
        WHERE n.tenant_id = p_tenant_id AND n.thread_id = p_thread_id
          AND n.checkpoint_ns = p_checkpoint_ns
        FOR NO KEY UPDATE;
        IF NOT FOUND THEN
            v_refused := replaysafe._langgraph_namespace(p_tenant_id, p_thread_id,
                                                         p_checkpoint_ns, true);
            -- Locked now; another put may have created the row (and a head) meanwhile.
            SELECT n.head INTO v_head FROM replaysafe.langgraph_namespaces n
            WHERE n.tenant_id = p_tenant_id AND n.thread_id = p_thread_id
              AND n.checkpoint_ns = p_checkpoint_ns;
        END IF;

        -- A run whose parent is not the head (or a first put): is it a fork?
        IF p_metadata ->> 'source' IN ('input', 'loop')
           AND p_parent_id IS DISTINCT FROM v_head THEN
            v_head := replaysafe._langgraph_head(p_tenant_id, p_thread_id, p_checkpoint_ns,
                                                 v_head);
            -- Saving the head again (same id) is no fork, nor is saving any checkpoint stored
            -- already (as stored it changes nothing; with other content it is refused below).
            IF v_head IS DISTINCT FROM p_checkpoint_id
               AND NOT EXISTS (SELECT 1 FROM replaysafe.langgraph_checkpoints c
                               WHERE c.tenant_id = p_tenant_id AND c.thread_id = p_thread_id
                                 AND c.checkpoint_ns = p_checkpoint_ns
                                 AND c.checkpoint_id = p_checkpoint_id)
               AND ((p_parent_id IS NOT NULL AND v_head IS DISTINCT FROM p_parent_id)
                    OR (p_parent_id IS NULL AND v_head IS NOT NULL
                        AND (p_metadata -> 'step' = '-1'::jsonb
                             OR (jsonb_typeof(p_checkpoint -> 'versions_seen') = 'object'
                                 AND (p_checkpoint -> 'versions_seen') - '__input__'
                                     <> '{}'::jsonb)))) THEN
                DELETE FROM replaysafe.langgraph_writes w
                WHERE w.tenant_id = p_tenant_id AND w.thread_id = p_thread_id
                  AND w.checkpoint_ns = p_checkpoint_ns AND w.checkpoint_id = p_checkpoint_id;
                -- The last 32 refusals are enough: a losing run stops at its next checkpoint.
                UPDATE replaysafe.langgraph_namespaces n
                SET refused = (n.refused || p_checkpoint_id)
                              [greatest(1, cardinality(n.refused) - 30):]
                WHERE n.tenant_id = p_tenant_id AND n.thread_id = p_thread_id
                  AND n.checkpoint_ns = p_checkpoint_ns;
                r.stored := false;
                r.head_checkpoint_id := v_head;
                RETURN r;
            END IF;
        END IF;
    END IF;

    IF cardinality(p_channels) > 0 THEN
        INSERT INTO replaysafe.langgraph_blobs (tenant_id, thread_id, checkpoint_ns, channel,
                                                version, type, blob)
        SELECT p_tenant_id, p_thread_id, p_checkpoint_ns, v.channel, v.version, v.type, v.blob
        FROM unnest(p_channels, p_versions, p_types, p_blobs) AS v(channel, version, type, blob)
        ON CONFLICT DO NOTHING;
    END IF;
    -- A new checkpoint becomes the head (the namespace is locked: no concurrent insert); one
    -- stored before stays as it is (or the put is refused, below), and the head where it was.
    INSERT INTO replaysafe.langgraph_checkpoints (
        tenant_id, thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, run_id,
        checkpoint, metadata, created_at)
    VALUES (p_tenant_id, p_thread_id, p_checkpoint_ns, p_checkpoint_id, p_parent_id,
            p_metadata ->> 'run_id', p_checkpoint, p_metadata, clock_timestamp())
    ON CONFLICT DO NOTHING;
    IF FOUND THEN
        IF NOT v_fast THEN  -- the fast path moved the head already
            UPDATE replaysafe.langgraph_namespaces n
            SET head = p_checkpoint_id, written_at = clock_timestamp()
            WHERE n.tenant_id = p_tenant_id AND n.thread_id = p_thread_id
              AND n.checkpoint_ns = p_checkpoint_ns;
        END IF;
        v_head := p_checkpoint_id;
    ELSE
        IF v_fast THEN
            -- The head the fast path moved goes back, and so does the namespace's last write
            -- (nothing was stored).
            UPDATE replaysafe.langgraph_namespaces n
            SET head = p_parent_id,
                written_at = coalesce((SELECT max(c.created_at) FROM replaysafe.langgraph_checkpoints c
                                       WHERE c.tenant_id = p_tenant_id AND c.thread_id = p_thread_id
                                         AND c.checkpoint_ns = p_checkpoint_ns), n.written_at)
            WHERE n.tenant_id = p_tenant_id AND n.thread_id = p_thread_id
              AND n.checkpoint_ns = p_checkpoint_ns;
            v_head := p_parent_id;
        END IF;
        -- A stored checkpoint is never changed in place: saving it again is allowed only as it
        -- is (nothing changes); other content is refused and nothing of this put is kept.
        IF NOT EXISTS (SELECT 1 FROM replaysafe.langgraph_checkpoints c
                       WHERE c.tenant_id = p_tenant_id AND c.thread_id = p_thread_id
                         AND c.checkpoint_ns = p_checkpoint_ns AND c.checkpoint_id = p_checkpoint_id
                         AND c.checkpoint = p_checkpoint AND c.metadata = p_metadata
                         AND c.parent_checkpoint_id IS NOT DISTINCT FROM p_parent_id) THEN
            PERFORM replaysafe._raise('RS001', 'checkpoint ' || p_checkpoint_id || ' of thread '
                || p_thread_id || ' is stored already with other content: a stored checkpoint '
                'is never changed in place');
        END IF;
        v_head := replaysafe._langgraph_head(p_tenant_id, p_thread_id, p_checkpoint_ns, v_head);
    END IF;

    -- With a history limit, the oldest checkpoints beyond it go (at most 4 per write, so the
    -- work per write stays bounded; a lowered limit is reached over a few writes), never the
    -- head, with their pending writes and the values no kept checkpoint uses (looked up among
    -- the kept ones).
    IF p_history_limit IS NOT NULL THEN
        FOR v_old IN SELECT c.checkpoint_id, c.checkpoint -> 'channel_versions' AS versions
                     FROM replaysafe.langgraph_checkpoints c
                     WHERE c.tenant_id = p_tenant_id AND c.thread_id = p_thread_id
                       AND c.checkpoint_ns = p_checkpoint_ns AND c.checkpoint_id <> v_head
                     ORDER BY c.checkpoint_id DESC
                     OFFSET p_history_limit - 1 LIMIT 4 LOOP
            DELETE FROM replaysafe.langgraph_checkpoints c
            WHERE c.tenant_id = p_tenant_id AND c.thread_id = p_thread_id
              AND c.checkpoint_ns = p_checkpoint_ns AND c.checkpoint_id = v_old.checkpoint_id;
            DELETE FROM replaysafe.langgraph_writes w
            WHERE w.tenant_id = p_tenant_id AND w.thread_id = p_thread_id
              AND w.checkpoint_ns = p_checkpoint_ns AND w.checkpoint_id = v_old.checkpoint_id;
            DELETE FROM replaysafe.langgraph_blobs b
            USING jsonb_each_text(coalesce(v_old.versions, '{}')) AS v(channel, version)
            WHERE b.tenant_id = p_tenant_id AND b.thread_id = p_thread_id
              AND b.checkpoint_ns = p_checkpoint_ns AND b.channel = v.channel
              AND b.version = v.version
              AND NOT EXISTS (
                  SELECT 1 FROM replaysafe.langgraph_checkpoints k
                  WHERE k.tenant_id = p_tenant_id AND k.thread_id = p_thread_id
                    AND k.checkpoint_ns = p_checkpoint_ns
                    AND (k.checkpoint -> 'channel_versions') ->> v.channel = v.version);
        END LOOP;
    END IF;
    r.stored := true;
    r.head_checkpoint_id := v_head;
    RETURN r;
END
$$;

-- Store a task's pending writes on a checkpoint (parallel arrays). A write already stored
-- under the same task and index is kept, except, with p_replace, a write of one of
-- LangGraph's special channels (errors, scheduled tasks, interrupts, resumes: LangGraph
-- replaces them as a task goes on) by a write of the same channel. Writes on a checkpoint
-- the namespace refused are dropped. Returns the number of writes stored.
CREATE OR REPLACE FUNCTION replaysafe.langgraph_put_writes(
    p_tenant_id     text,
    p_thread_id     text,
    p_checkpoint_ns text,
    p_checkpoint_id text,
    p_task_id       text,
    p_task_path     text,
    p_idx           integer[],
    p_channels      text[],
    p_types         text[],
    p_blobs         bytea[],
    p_replace       boolean DEFAULT false,
    p_grant         text    DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_user    text;
    v_refused text[];
    v_count   integer;
    l         replaysafe.limits;
BEGIN
    IF (octet_length(p_tenant_id) BETWEEN 1 AND 1024 AND length(p_tenant_id) <= 512
        AND octet_length(p_thread_id) BETWEEN 1 AND 1024 AND length(p_thread_id) <= 512
        AND octet_length(p_checkpoint_ns) <= 1024 AND length(p_checkpoint_ns) <= 512)
       IS NOT TRUE THEN
        PERFORM replaysafe._langgraph_check_args(p_tenant_id, p_thread_id, p_checkpoint_ns);
    END IF;
    PERFORM replaysafe._check_id('p_checkpoint_id', p_checkpoint_id);
    PERFORM replaysafe._check_id('p_task_id', p_task_id);
    IF p_task_path IS NULL THEN
        PERFORM replaysafe._invalid('p_task_path', 'must not be NULL');
    END IF;
    IF p_idx IS NULL OR p_channels IS NULL OR p_types IS NULL OR p_blobs IS NULL
       OR cardinality(p_channels) <> cardinality(p_idx)
       OR cardinality(p_types) <> cardinality(p_idx)
       OR cardinality(p_blobs) <> cardinality(p_idx) THEN
        PERFORM replaysafe._invalid('p_idx',
            'p_idx, p_channels, p_types and p_blobs must be arrays of one length');
    END IF;
    IF cardinality(p_idx) > 0 AND EXISTS (
           SELECT 1 FROM unnest(p_idx, p_channels, p_types, p_blobs) AS w(idx, channel, type, blob)
           WHERE w.idx IS NULL OR w.channel IS NULL OR w.type IS NULL OR w.blob IS NULL) THEN
        PERFORM replaysafe._invalid('p_idx',
            'p_idx, p_channels, p_types and p_blobs must have no NULL element');
    END IF;
    SELECT * INTO l FROM replaysafe.limits;
    PERFORM replaysafe._langgraph_check_keys(octet_length(p_tenant_id), l.langgraph_key_bytes,
                                             octet_length(p_thread_id) + octet_length(p_checkpoint_ns)
                                             + octet_length(p_checkpoint_id)
                                             + octet_length(p_task_id), p_channels);
    PERFORM replaysafe._langgraph_check_blobs('p_blobs', p_blobs, 'pending_write_bytes',
                                              l.pending_write_bytes);
    v_user := replaysafe._acts_for(p_tenant_id, p_grant);
    -- A user's writer holds its thread before the owner check: a delete or purge that takes the
    -- thread meanwhile is waited for, and the check then sees what it left.
    IF v_user IS NOT NULL THEN
        PERFORM replaysafe._langgraph_hold_thread(p_tenant_id, p_thread_id);
    END IF;
    PERFORM replaysafe._langgraph_user_thread(p_tenant_id, p_thread_id, v_user, true);
    PERFORM replaysafe._durable();

    v_refused := replaysafe._langgraph_namespace(p_tenant_id, p_thread_id, p_checkpoint_ns, false);
    IF p_checkpoint_id = ANY (v_refused) THEN
        RETURN 0;
    END IF;
    IF p_replace THEN
        INSERT INTO replaysafe.langgraph_writes (tenant_id, thread_id, checkpoint_ns,
                                                 checkpoint_id, task_id, idx, channel, type,
                                                 blob, task_path)
        SELECT p_tenant_id, p_thread_id, p_checkpoint_ns, p_checkpoint_id, p_task_id, w.idx,
               w.channel, w.type, w.blob, p_task_path
        FROM unnest(p_idx, p_channels, p_types, p_blobs) AS w(idx, channel, type, blob)
        ON CONFLICT (tenant_id, thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE
        SET channel = excluded.channel, type = excluded.type, blob = excluded.blob,
            task_path = excluded.task_path
        WHERE langgraph_writes.channel = excluded.channel
          AND langgraph_writes.channel IN ('__error__', '__scheduled__', '__interrupt__', '__resume__');
    ELSE
        INSERT INTO replaysafe.langgraph_writes (tenant_id, thread_id, checkpoint_ns,
                                                 checkpoint_id, task_id, idx, channel, type,
                                                 blob, task_path)
        SELECT p_tenant_id, p_thread_id, p_checkpoint_ns, p_checkpoint_id, p_task_id, w.idx,
               w.channel, w.type, w.blob, p_task_path
        FROM unnest(p_idx, p_channels, p_types, p_blobs) AS w(idx, channel, type, blob)
        ON CONFLICT DO NOTHING;
    END IF;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END
$$;

-- One checkpoint with its values and pending writes: p_checkpoint_id's, or the head of the
-- thread and namespace (the checkpoint put stored last). No row when there is none.
CREATE OR REPLACE FUNCTION replaysafe.langgraph_get_tuple(
    p_tenant_id     text,
    p_thread_id     text,
    p_checkpoint_ns text DEFAULT '',
    p_checkpoint_id text DEFAULT NULL,
    p_grant         text DEFAULT NULL)
RETURNS SETOF replaysafe.langgraph_checkpoint_record
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_user    text;
    v_id text := p_checkpoint_id;
BEGIN
    IF (octet_length(p_tenant_id) BETWEEN 1 AND 1024 AND length(p_tenant_id) <= 512
        AND octet_length(p_thread_id) BETWEEN 1 AND 1024 AND length(p_thread_id) <= 512
        AND octet_length(p_checkpoint_ns) <= 1024 AND length(p_checkpoint_ns) <= 512)
       IS NOT TRUE THEN
        PERFORM replaysafe._langgraph_check_args(p_tenant_id, p_thread_id, p_checkpoint_ns);
    END IF;
    -- The tenant check's common case inline: a caller bound to p_tenant_id (_binding), outside
    -- a security-restricted operation, without a grant. Anything else, and any argument with a
    -- COLLATE clause, takes _acts_for's whole path (its answer or its error). Both tests
    -- compare under "C" (see _acts_for).
    IF p_grant IS NOT NULL OR pg_collation_for(p_tenant_id) COLLATE "C" IS DISTINCT FROM '"default"'
       OR (replaysafe._binding() = p_tenant_id COLLATE "C") IS NOT TRUE
       OR replaysafe._in_restricted_operation() THEN
        v_user := replaysafe._acts_for(p_tenant_id, p_grant);
    END IF;
    PERFORM replaysafe._langgraph_user_thread(p_tenant_id, p_thread_id, v_user, false);

    IF v_id IS NULL THEN
        SELECT n.head INTO v_id FROM replaysafe.langgraph_namespaces n
        WHERE n.tenant_id = p_tenant_id AND n.thread_id = p_thread_id
          AND n.checkpoint_ns = p_checkpoint_ns;
        v_id := replaysafe._langgraph_head(p_tenant_id, p_thread_id, p_checkpoint_ns, v_id);
        IF v_id IS NULL THEN
            RETURN;
        END IF;
    END IF;

    RETURN QUERY
    SELECT c.thread_id, c.checkpoint_ns, c.checkpoint_id::text, c.parent_checkpoint_id::text,
           c.checkpoint, c.metadata, b.channels, b.types, b.blobs,
           w.task_ids, w.channels, w.types, w.blobs
    FROM (SELECT * FROM replaysafe.langgraph_checkpoints x
          WHERE x.tenant_id = p_tenant_id AND x.thread_id = p_thread_id
            AND x.checkpoint_ns = p_checkpoint_ns AND x.checkpoint_id = v_id) c
    CROSS JOIN LATERAL (
        SELECT array_agg(v.channel) AS channels, array_agg(x.type) AS types,
               array_agg(x.blob) AS blobs
        FROM jsonb_each_text(c.checkpoint -> 'channel_versions') AS v(channel, version)
        -- One primary-key lookup per channel (LIMIT keeps the planner from turning this
        -- into a scan of every value the thread ever stored).
        CROSS JOIN LATERAL (
            SELECT y.type, y.blob FROM replaysafe.langgraph_blobs y
            WHERE y.tenant_id = c.tenant_id AND y.thread_id = c.thread_id
              AND y.checkpoint_ns = c.checkpoint_ns AND y.channel = v.channel
              AND y.version = v.version
            LIMIT 1) x) b
    CROSS JOIN LATERAL (
        SELECT array_agg(x.task_id ORDER BY x.task_path COLLATE "C", x.task_id COLLATE "C", x.idx)
                   AS task_ids,
               array_agg(x.channel ORDER BY x.task_path COLLATE "C", x.task_id COLLATE "C", x.idx)
                   AS channels,
               array_agg(x.type ORDER BY x.task_path COLLATE "C", x.task_id COLLATE "C", x.idx)
                   AS types,
               array_agg(x.blob ORDER BY x.task_path COLLATE "C", x.task_id COLLATE "C", x.idx)
                   AS blobs
        FROM replaysafe.langgraph_writes x
        WHERE x.tenant_id = c.tenant_id AND x.thread_id = c.thread_id
          AND x.checkpoint_ns = c.checkpoint_ns AND x.checkpoint_id = c.checkpoint_id) w;
END
$$;

-- Checkpoints newest first: of one thread (all threads of the tenant when p_thread_id is
-- NULL), one namespace (all when NULL), whose metadata contains p_filter, older than
-- p_before, at most p_limit (all when NULL).
CREATE OR REPLACE FUNCTION replaysafe.langgraph_list(
    p_tenant_id     text,
    p_thread_id     text    DEFAULT NULL,
    p_checkpoint_ns text    DEFAULT NULL,
    p_checkpoint_id text    DEFAULT NULL,
    p_filter        jsonb   DEFAULT NULL,
    p_before        text    DEFAULT NULL,
    p_limit         integer DEFAULT NULL,
    p_grant         text    DEFAULT NULL)
RETURNS SETOF replaysafe.langgraph_checkpoint_record
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_user text;
BEGIN
    PERFORM replaysafe._check_id('p_tenant_id', p_tenant_id);
    PERFORM replaysafe._check_id('p_thread_id', p_thread_id, true);
    IF p_filter IS NOT NULL AND jsonb_typeof(p_filter) <> 'object' THEN
        PERFORM replaysafe._invalid('p_filter', 'must be a JSON object');
    END IF;
    IF p_limit < 0 THEN
        PERFORM replaysafe._invalid('p_limit', 'must not be negative');
    END IF;
    v_user := replaysafe._acts_for(p_tenant_id, p_grant);
    PERFORM replaysafe._langgraph_user_thread(p_tenant_id, p_thread_id, v_user, false);

    RETURN QUERY
    SELECT c.thread_id, c.checkpoint_ns, c.checkpoint_id::text, c.parent_checkpoint_id::text,
           c.checkpoint, c.metadata, b.channels, b.types, b.blobs,
           w.task_ids, w.channels, w.types, w.blobs
    FROM (SELECT * FROM replaysafe.langgraph_checkpoints x
          WHERE x.tenant_id = p_tenant_id
            AND (p_thread_id IS NULL OR x.thread_id = p_thread_id)
            AND (v_user IS NULL OR x.thread_id IN (
                     SELECT u.thread_id FROM replaysafe.langgraph_thread_users u
                     WHERE u.tenant_id = p_tenant_id AND u.user_id = v_user))
            AND (p_checkpoint_ns IS NULL OR x.checkpoint_ns = p_checkpoint_ns)
            AND (p_checkpoint_id IS NULL OR x.checkpoint_id = p_checkpoint_id)
            AND (p_filter IS NULL OR x.metadata @> p_filter)
            AND (p_before IS NULL OR x.checkpoint_id < p_before COLLATE "C")
          ORDER BY x.checkpoint_id DESC
          LIMIT p_limit) c
    CROSS JOIN LATERAL (
        SELECT array_agg(v.channel) AS channels, array_agg(x.type) AS types,
               array_agg(x.blob) AS blobs
        FROM jsonb_each_text(c.checkpoint -> 'channel_versions') AS v(channel, version)
        -- One primary-key lookup per channel (LIMIT keeps the planner from turning this
        -- into a scan of every value the thread ever stored).
        CROSS JOIN LATERAL (
            SELECT y.type, y.blob FROM replaysafe.langgraph_blobs y
            WHERE y.tenant_id = c.tenant_id AND y.thread_id = c.thread_id
              AND y.checkpoint_ns = c.checkpoint_ns AND y.channel = v.channel
              AND y.version = v.version
            LIMIT 1) x) b
    CROSS JOIN LATERAL (
        SELECT array_agg(x.task_id ORDER BY x.task_path COLLATE "C", x.task_id COLLATE "C", x.idx)
                   AS task_ids,
               array_agg(x.channel ORDER BY x.task_path COLLATE "C", x.task_id COLLATE "C", x.idx)
                   AS channels,
               array_agg(x.type ORDER BY x.task_path COLLATE "C", x.task_id COLLATE "C", x.idx)
                   AS types,
               array_agg(x.blob ORDER BY x.task_path COLLATE "C", x.task_id COLLATE "C", x.idx)
                   AS blobs
        FROM replaysafe.langgraph_writes x
        WHERE x.tenant_id = c.tenant_id AND x.thread_id = c.thread_id
          AND x.checkpoint_ns = c.checkpoint_ns AND x.checkpoint_id = c.checkpoint_id) w
    ORDER BY c.checkpoint_id DESC;
END
$$;

-- Every checkpoint, value and pending write of a thread (all namespaces). False when it had none.
-- Its namespaces are locked first: a put in flight is either deleted too or comes after.
CREATE OR REPLACE FUNCTION replaysafe.langgraph_delete_thread(p_tenant_id text, p_thread_id text,
                                                             p_grant text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_user    text;
    v_found boolean;
BEGIN
    PERFORM replaysafe._check_id('p_tenant_id', p_tenant_id);
    PERFORM replaysafe._check_id('p_thread_id', p_thread_id);
    v_user := replaysafe._acts_for(p_tenant_id, p_grant);
    -- Writers in flight first (a put into a new namespace holds no other row this could lock).
    PERFORM 1 FROM replaysafe.langgraph_threads t
    WHERE t.tenant_id = p_tenant_id AND t.thread_id = p_thread_id
    FOR UPDATE;
    PERFORM replaysafe._langgraph_user_thread(p_tenant_id, p_thread_id, v_user, false);
    PERFORM replaysafe._durable();

    PERFORM 1 FROM replaysafe.langgraph_namespaces n
    WHERE n.tenant_id = p_tenant_id AND n.thread_id = p_thread_id
    ORDER BY n.checkpoint_ns
    FOR UPDATE;
    DELETE FROM replaysafe.langgraph_checkpoints c
    WHERE c.tenant_id = p_tenant_id AND c.thread_id = p_thread_id;
    v_found := FOUND;
    DELETE FROM replaysafe.langgraph_writes w
    WHERE w.tenant_id = p_tenant_id AND w.thread_id = p_thread_id;
    DELETE FROM replaysafe.langgraph_blobs b
    WHERE b.tenant_id = p_tenant_id AND b.thread_id = p_thread_id;
    DELETE FROM replaysafe.langgraph_namespaces n
    WHERE n.tenant_id = p_tenant_id AND n.thread_id = p_thread_id;
    DELETE FROM replaysafe.langgraph_thread_users u  -- a deleted thread is nobody's
    WHERE u.tenant_id = p_tenant_id AND u.thread_id = p_thread_id;
    DELETE FROM replaysafe.langgraph_threads t
    WHERE t.tenant_id = p_tenant_id AND t.thread_id = p_thread_id;
    RETURN v_found;
END
$$;

-- The checkpoints whose metadata run_id is one of p_run_ids, with their pending writes and
-- the values no other checkpoint uses. Values are collected only in a namespace whose lock is
-- free (a put in flight may still use them; a later delete_for_runs or prune collects them).
-- Returns the number of checkpoints deleted.
CREATE OR REPLACE FUNCTION replaysafe.langgraph_delete_for_runs(p_tenant_id text, p_run_ids text[],
                                                               p_grant text DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_user    text;
    v_count   integer;
    v_threads text[];
    v_spaces  text[];
    v_ids     text[];  -- the deleted checkpoints, with their threads and namespaces:
    v_id_threads text[];
    v_id_spaces  text[];
    v_head    text;
BEGIN
    PERFORM replaysafe._check_id('p_tenant_id', p_tenant_id);
    IF p_run_ids IS NULL OR array_position(p_run_ids, NULL) IS NOT NULL THEN
        PERFORM replaysafe._invalid('p_run_ids', 'must be an array of run ids');
    END IF;
    v_user := replaysafe._acts_for(p_tenant_id, p_grant);
    PERFORM replaysafe._durable();

    -- The runs' namespaces locked first (waiting, in one order, as prune and delete_thread):
    -- a put or put_writes in flight there commits before its checkpoint, its pending writes
    -- and its values are looked at, so no head is left on a deleted checkpoint and no
    -- pending write of one survives (skipping a busy namespace would leave both).
    PERFORM 1 FROM replaysafe.langgraph_namespaces n
    WHERE n.tenant_id = p_tenant_id
      AND (n.thread_id, n.checkpoint_ns) IN (
          SELECT c.thread_id, c.checkpoint_ns FROM replaysafe.langgraph_checkpoints c
          WHERE c.tenant_id = p_tenant_id AND c.run_id = ANY (p_run_ids)
            AND (v_user IS NULL OR c.thread_id IN (
                     SELECT u.thread_id FROM replaysafe.langgraph_thread_users u
                     WHERE u.tenant_id = p_tenant_id AND u.user_id = v_user)))
    ORDER BY n.thread_id, n.checkpoint_ns
    FOR NO KEY UPDATE;

    WITH d AS (
        DELETE FROM replaysafe.langgraph_checkpoints c
        WHERE c.tenant_id = p_tenant_id AND c.run_id = ANY (p_run_ids)
          AND (v_user IS NULL OR c.thread_id IN (
                   SELECT u.thread_id FROM replaysafe.langgraph_thread_users u
                   WHERE u.tenant_id = p_tenant_id AND u.user_id = v_user))
        RETURNING c.thread_id, c.checkpoint_ns, c.checkpoint_id),
    w AS (
        DELETE FROM replaysafe.langgraph_writes x
        USING d
        WHERE x.tenant_id = p_tenant_id AND x.thread_id = d.thread_id
          AND x.checkpoint_ns = d.checkpoint_ns AND x.checkpoint_id = d.checkpoint_id)
    SELECT (SELECT count(*) FROM d), s.threads, s.spaces, i.threads, i.spaces, i.ids
    INTO v_count, v_threads, v_spaces, v_id_threads, v_id_spaces, v_ids
    FROM (SELECT array_agg(p.thread_id ORDER BY p.thread_id, p.checkpoint_ns) AS threads,
                 array_agg(p.checkpoint_ns ORDER BY p.thread_id, p.checkpoint_ns) AS spaces
          FROM (SELECT DISTINCT d.thread_id, d.checkpoint_ns FROM d) p) s,
         (SELECT array_agg(d.thread_id) AS threads, array_agg(d.checkpoint_ns) AS spaces,
                 array_agg(d.checkpoint_id) AS ids FROM d) i;
    FOR i IN 1..coalesce(cardinality(v_threads), 0) LOOP
        SELECT n.head INTO v_head FROM replaysafe.langgraph_namespaces n
        WHERE n.tenant_id = p_tenant_id AND n.thread_id = v_threads[i]
          AND n.checkpoint_ns = v_spaces[i]
        FOR NO KEY UPDATE;
        CONTINUE WHEN NOT FOUND;
        UPDATE replaysafe.langgraph_namespaces n
        SET head = replaysafe._langgraph_head(p_tenant_id, v_threads[i], v_spaces[i], v_head)
        WHERE n.tenant_id = p_tenant_id AND n.thread_id = v_threads[i]
          AND n.checkpoint_ns = v_spaces[i];
        PERFORM replaysafe._langgraph_collect_blobs(p_tenant_id, v_threads[i], v_spaces[i]);
    END LOOP;
    -- Every namespace is locked now (in the loop, in the same order, where a run's
    -- checkpoint committed between the lock above and the DELETE): a put_writes of a deleted
    -- checkpoint that was in flight there has committed; its writes go too.
    IF v_count > 0 THEN
        DELETE FROM replaysafe.langgraph_writes x
        USING unnest(v_id_threads, v_id_spaces, v_ids) AS d(thread_id, checkpoint_ns, id)
        WHERE x.tenant_id = p_tenant_id AND x.thread_id = d.thread_id
          AND x.checkpoint_ns = d.checkpoint_ns AND x.checkpoint_id = d.id;
    END IF;
    RETURN v_count;
END
$$;

-- Copy every checkpoint, value and pending write of a thread to a thread that has none
-- (RS005 when the target has checkpoints). Returns the number of checkpoints copied.
CREATE OR REPLACE FUNCTION replaysafe.langgraph_copy_thread(p_tenant_id text, p_source_thread_id text,
                                                 p_target_thread_id text, p_grant text DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_user    text;
    v_count integer;
    v_keys    bigint;
BEGIN
    PERFORM replaysafe._check_id('p_tenant_id', p_tenant_id);
    PERFORM replaysafe._check_id('p_source_thread_id', p_source_thread_id);
    PERFORM replaysafe._check_id('p_target_thread_id', p_target_thread_id);
    v_user := replaysafe._acts_for(p_tenant_id, p_grant);
    PERFORM replaysafe._langgraph_user_thread(p_tenant_id, p_source_thread_id, v_user, false);
    IF p_source_thread_id IS DISTINCT FROM p_target_thread_id
       AND EXISTS (SELECT 1 FROM replaysafe.langgraph_namespaces n
                   WHERE n.tenant_id = p_tenant_id AND n.thread_id = p_source_thread_id) THEN
        PERFORM replaysafe._langgraph_hold_thread(p_tenant_id, p_source_thread_id);
        PERFORM replaysafe._langgraph_hold_thread(p_tenant_id, p_target_thread_id);
    END IF;
    PERFORM replaysafe._langgraph_user_thread(p_tenant_id, p_target_thread_id, v_user, true);
    PERFORM replaysafe._durable();
    IF p_source_thread_id = p_target_thread_id THEN
        RETURN 0;
    END IF;
    -- The target's root namespace is locked while it is filled: no run writes into it meanwhile.
    PERFORM replaysafe._langgraph_namespace(p_tenant_id, p_target_thread_id, '', true);
    IF EXISTS (SELECT 1 FROM replaysafe.langgraph_checkpoints c
               WHERE c.tenant_id = p_tenant_id AND c.thread_id = p_target_thread_id) THEN
        PERFORM replaysafe._invalid('p_target_thread_id',
            'the target thread already has checkpoints (delete it first)');
    END IF;
    -- The source's rows under the target's thread id keep the key limits (_langgraph_check_keys).
    SELECT greatest(
        (SELECT max(octet_length(c.checkpoint_ns) + octet_length(c.checkpoint_id))
         FROM replaysafe.langgraph_checkpoints c
         WHERE c.tenant_id = p_tenant_id AND c.thread_id = p_source_thread_id),
        (SELECT max(octet_length(b.checkpoint_ns) + octet_length(b.channel) + octet_length(b.version))
         FROM replaysafe.langgraph_blobs b
         WHERE b.tenant_id = p_tenant_id AND b.thread_id = p_source_thread_id),
        (SELECT max(octet_length(w.checkpoint_ns) + octet_length(w.checkpoint_id)
                    + octet_length(w.task_id) + octet_length(w.channel))
         FROM replaysafe.langgraph_writes w
         WHERE w.tenant_id = p_tenant_id AND w.thread_id = p_source_thread_id))
    INTO v_keys;
    PERFORM replaysafe._langgraph_check_keys(octet_length(p_tenant_id), l.langgraph_key_bytes,
                                             octet_length(p_target_thread_id) + coalesce(v_keys, 0))
    FROM replaysafe.limits l;

    INSERT INTO replaysafe.langgraph_checkpoints (tenant_id, thread_id, checkpoint_ns,
        checkpoint_id, parent_checkpoint_id, run_id, checkpoint, metadata, created_at)
    SELECT c.tenant_id, p_target_thread_id, c.checkpoint_ns, c.checkpoint_id,
           c.parent_checkpoint_id, c.run_id, c.checkpoint, c.metadata, c.created_at
    FROM replaysafe.langgraph_checkpoints c
    WHERE c.tenant_id = p_tenant_id AND c.thread_id = p_source_thread_id;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    INSERT INTO replaysafe.langgraph_blobs (tenant_id, thread_id, checkpoint_ns, channel,
                                            version, type, blob)
    SELECT b.tenant_id, p_target_thread_id, b.checkpoint_ns, b.channel, b.version, b.type, b.blob
    FROM replaysafe.langgraph_blobs b
    WHERE b.tenant_id = p_tenant_id AND b.thread_id = p_source_thread_id
    ON CONFLICT DO NOTHING;
    INSERT INTO replaysafe.langgraph_writes (tenant_id, thread_id, checkpoint_ns, checkpoint_id,
                                             task_id, idx, channel, type, blob, task_path)
    SELECT w.tenant_id, p_target_thread_id, w.checkpoint_ns, w.checkpoint_id, w.task_id, w.idx,
           w.channel, w.type, w.blob, w.task_path
    FROM replaysafe.langgraph_writes w
    WHERE w.tenant_id = p_tenant_id AND w.thread_id = p_source_thread_id
    ON CONFLICT DO NOTHING;
    INSERT INTO replaysafe.langgraph_namespaces AS n (tenant_id, thread_id, checkpoint_ns, head)
    SELECT s.tenant_id, p_target_thread_id, s.checkpoint_ns, s.head
    FROM replaysafe.langgraph_namespaces s
    WHERE s.tenant_id = p_tenant_id AND s.thread_id = p_source_thread_id
    ON CONFLICT (tenant_id, thread_id, checkpoint_ns)
    DO UPDATE SET head = excluded.head, written_at = excluded.written_at;
    RETURN v_count;
END
$$;

-- Prune threads: "keep_latest" keeps the head of each namespace (with its
-- pending writes and the values it uses), "delete" removes everything. Returns the number
-- of checkpoints deleted.
CREATE OR REPLACE FUNCTION replaysafe.langgraph_prune(p_tenant_id text, p_thread_ids text[],
                                           p_strategy text DEFAULT 'keep_latest',
                                           p_grant text DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_user    text;
    v_count integer := 0;
    v_n     integer;
    v_head  text;
    r       record;
BEGIN
    PERFORM replaysafe._check_id('p_tenant_id', p_tenant_id);
    IF p_thread_ids IS NULL OR array_position(p_thread_ids, NULL) IS NOT NULL THEN
        PERFORM replaysafe._invalid('p_thread_ids', 'must be an array of thread ids');
    END IF;
    IF p_strategy IS NULL OR p_strategy NOT IN ('keep_latest', 'delete') THEN
        PERFORM replaysafe._invalid('p_strategy', 'must be keep_latest or delete (got '
            || coalesce(p_strategy, 'NULL') || ')');
    END IF;
    v_user := replaysafe._acts_for(p_tenant_id, p_grant);
    PERFORM replaysafe._langgraph_user_thread(p_tenant_id, t, v_user, false)
    FROM unnest(p_thread_ids) t;
    PERFORM replaysafe._durable();

    IF p_strategy = 'delete' THEN
        -- Locked first, as delete_thread: the threads (a writer creating a namespace holds its
        -- thread), then their namespaces.
        PERFORM 1 FROM replaysafe.langgraph_threads t
        WHERE t.tenant_id = p_tenant_id AND t.thread_id = ANY (p_thread_ids)
        ORDER BY t.thread_id
        FOR UPDATE;
        PERFORM 1 FROM replaysafe.langgraph_namespaces n
        WHERE n.tenant_id = p_tenant_id AND n.thread_id = ANY (p_thread_ids)
        ORDER BY n.thread_id, n.checkpoint_ns
        FOR UPDATE;
        DELETE FROM replaysafe.langgraph_checkpoints c
        WHERE c.tenant_id = p_tenant_id AND c.thread_id = ANY (p_thread_ids);
        GET DIAGNOSTICS v_count = ROW_COUNT;
        DELETE FROM replaysafe.langgraph_writes w
        WHERE w.tenant_id = p_tenant_id AND w.thread_id = ANY (p_thread_ids);
        DELETE FROM replaysafe.langgraph_blobs b
        WHERE b.tenant_id = p_tenant_id AND b.thread_id = ANY (p_thread_ids);
        DELETE FROM replaysafe.langgraph_namespaces n
        WHERE n.tenant_id = p_tenant_id AND n.thread_id = ANY (p_thread_ids);
        DELETE FROM replaysafe.langgraph_thread_users u
        WHERE u.tenant_id = p_tenant_id AND u.thread_id = ANY (p_thread_ids);
        DELETE FROM replaysafe.langgraph_threads t
        WHERE t.tenant_id = p_tenant_id AND t.thread_id = ANY (p_thread_ids);
        RETURN v_count;
    END IF;

    FOR r IN SELECT DISTINCT c.thread_id, c.checkpoint_ns FROM replaysafe.langgraph_checkpoints c
             WHERE c.tenant_id = p_tenant_id AND c.thread_id = ANY (p_thread_ids)
             ORDER BY c.thread_id, c.checkpoint_ns LOOP
        -- Locked like a checkpoint write: the head stays the head while we prune.
        PERFORM replaysafe._langgraph_namespace(p_tenant_id, r.thread_id, r.checkpoint_ns, true);
        SELECT n.head INTO v_head FROM replaysafe.langgraph_namespaces n
        WHERE n.tenant_id = p_tenant_id AND n.thread_id = r.thread_id
          AND n.checkpoint_ns = r.checkpoint_ns;
        v_head := replaysafe._langgraph_head(p_tenant_id, r.thread_id, r.checkpoint_ns, v_head);
        CONTINUE WHEN v_head IS NULL;
        UPDATE replaysafe.langgraph_namespaces n SET head = v_head
        WHERE n.tenant_id = p_tenant_id AND n.thread_id = r.thread_id
          AND n.checkpoint_ns = r.checkpoint_ns;
        DELETE FROM replaysafe.langgraph_checkpoints c
        WHERE c.tenant_id = p_tenant_id AND c.thread_id = r.thread_id
          AND c.checkpoint_ns = r.checkpoint_ns AND c.checkpoint_id <> v_head;
        GET DIAGNOSTICS v_n = ROW_COUNT;
        CONTINUE WHEN v_n = 0;
        v_count := v_count + v_n;
        UPDATE replaysafe.langgraph_checkpoints c SET parent_checkpoint_id = NULL
        WHERE c.tenant_id = p_tenant_id AND c.thread_id = r.thread_id
          AND c.checkpoint_ns = r.checkpoint_ns AND c.checkpoint_id = v_head;
        DELETE FROM replaysafe.langgraph_writes w
        WHERE w.tenant_id = p_tenant_id AND w.thread_id = r.thread_id
          AND w.checkpoint_ns = r.checkpoint_ns AND w.checkpoint_id <> v_head;
        PERFORM replaysafe._langgraph_collect_blobs(p_tenant_id, r.thread_id, r.checkpoint_ns);
    END LOOP;
    RETURN v_count;
END
$$;

-- Operability: what a monitoring system scrapes (metrics) and age-based retention of
-- threads (purge_threads). docs/operability.md.

-- A planner estimate of a query's rows (EXPLAIN, nothing executed): the terminal actions and
-- the threads, which exact counts would read row by row. The query is the function's own
-- constant text, so the estimate is that of its plan; an empty table is 0, and a table never
-- analyzed (no statistics: the planner would guess) has no estimate (NULL).
CREATE OR REPLACE FUNCTION replaysafe._estimate(p_table regclass, p_query text)
RETURNS double precision
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_plan json;
BEGIN
    IF pg_catalog.pg_relation_size(p_table) = 0 THEN
        RETURN 0;
    END IF;
    IF (SELECT c.reltuples FROM pg_catalog.pg_class c WHERE c.oid = p_table) < 0 THEN
        RETURN NULL;
    END IF;
    EXECUTE 'EXPLAIN (FORMAT JSON) ' || p_query INTO v_plan;
    RETURN pg_catalog.round(((v_plan -> 0 -> 'Plan' ->> 'Plan Rows')::double precision));
END
$$;

-- Rows for a metrics scraper (name, tenant_id, state, value), of the caller's tenant (its
-- binding, or p_grant's tenant), or of every tenant for the schema owner and roles bound to
-- all tenants. Exact: the running, unknown and retryable actions, the unresolved ones
-- (unknown, or running with an expired lease), the oldest unresolved one's age in seconds
-- (0 when none), multi-effect actions and expired leases, each from index scans of those
-- rows only (a multi-effect action has a superseded successful report: of two successful
-- attempts only one can settle the action, and only a failed action can be reopened). Estimated (planner statistics, no row read): succeeded and failed actions and
-- live threads; for an all-tenant caller these are totals (tenant_id NULL). p_by_tenant
-- false: every row a total (tenant_id NULL), for installations with many tenants. A role
-- that acts for no tenant gets no row, as the views show it nothing.
CREATE OR REPLACE FUNCTION replaysafe.metrics(p_by_tenant boolean DEFAULT true,
                                              p_now timestamptz DEFAULT clock_timestamp(),
                                              p_grant text DEFAULT NULL)
RETURNS TABLE (name text, tenant_id text, state text, value double precision)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_tenant text;
    v_all    boolean;
BEGIN
    IF p_by_tenant IS NULL THEN
        PERFORM replaysafe._invalid('p_by_tenant', 'must be true or false');
    END IF;
    IF (p_now BETWEEN clock_timestamp() - interval '5 minutes' AND clock_timestamp()) IS NOT TRUE THEN
        p_now := replaysafe._check_now(p_now, p_grant);
    END IF;
    SELECT s.tenant_id, s.acts_for_all INTO v_tenant, v_all
    FROM replaysafe._sweep_scope(NULL, p_grant, '{worker,operator,auditor}') s;
    IF v_tenant IS NULL AND NOT v_all THEN
        RETURN;
    END IF;

    IF v_tenant IS NOT NULL THEN
        -- One tenant: each count an index range of that tenant's rows in that state.
        RETURN QUERY
        WITH c AS (
            SELECT (SELECT count(*) FROM replaysafe.actions x
                    WHERE x.tenant_id = v_tenant AND x.state = 'running') AS running,
                   (SELECT count(*) FROM replaysafe.actions x
                    WHERE x.tenant_id = v_tenant AND x.state = 'running'
                      AND x.lease_expires_at <= p_now) AS expired,
                   (SELECT count(*) FROM replaysafe.actions x
                    WHERE x.tenant_id = v_tenant AND x.state = 'unknown') AS unknown,
                   (SELECT count(*) FROM replaysafe.actions x
                    WHERE x.tenant_id = v_tenant AND x.state = 'retryable') AS retryable,
                   (SELECT min(x.updated_at) FROM replaysafe.actions x
                    WHERE x.tenant_id = v_tenant AND x.state = 'unknown') AS oldest_unknown,
                   (SELECT min(x.lease_expires_at) FROM replaysafe.actions x
                    WHERE x.tenant_id = v_tenant AND x.state = 'running'
                      AND x.lease_expires_at <= p_now) AS oldest_expired,
                   (SELECT count(DISTINCT t.action_key) FROM replaysafe.action_attempts t
                    WHERE t.tenant_id = v_tenant AND t.outcome = 'succeeded' AND t.superseded
                      AND EXISTS (SELECT 1 FROM replaysafe.action_attempts o
                                  WHERE o.tenant_id = t.tenant_id AND o.action_key = t.action_key
                                    AND o.attempt <> t.attempt AND o.outcome = 'succeeded'))
                       AS multi)
        SELECT m.name, CASE WHEN p_by_tenant THEN v_tenant END, m.state, m.value
        FROM c CROSS JOIN LATERAL (VALUES
            ('replaysafe_actions', 'running', c.running::double precision),
            ('replaysafe_actions', 'unknown', c.unknown::double precision),
            ('replaysafe_actions', 'retryable', c.retryable::double precision),
            ('replaysafe_unresolved_actions', NULL, (c.unknown + c.expired)::double precision),
            ('replaysafe_oldest_unresolved_age_seconds', NULL, coalesce(greatest(
                extract(epoch FROM p_now - c.oldest_unknown),
                extract(epoch FROM p_now - c.oldest_expired)), 0)::double precision),
            ('replaysafe_multi_effect_actions', NULL, c.multi::double precision),
            ('replaysafe_expired_leases', NULL, c.expired::double precision)) m(name, state, value);
        RETURN;
    END IF;

    -- Every tenant: the exact counts grouped by tenant through the partial indexes of those
    -- states (a tenant with none of a kind has no row of it), or one total each.
    RETURN QUERY
    WITH per AS (
        SELECT x.tenant_id, 'running'::text AS state, count(*) AS n,
               count(*) FILTER (WHERE x.lease_expires_at <= p_now) AS expired,
               min(x.lease_expires_at) FILTER (WHERE x.lease_expires_at <= p_now) AS oldest
        FROM replaysafe.actions x WHERE x.state = 'running' GROUP BY x.tenant_id
        UNION ALL
        SELECT x.tenant_id, 'unknown', count(*), 0, min(x.updated_at)
        FROM replaysafe.actions x WHERE x.state = 'unknown' GROUP BY x.tenant_id
        UNION ALL
        SELECT x.tenant_id, 'retryable', count(*), 0, NULL
        FROM replaysafe.actions x WHERE x.state = 'retryable' GROUP BY x.tenant_id
        UNION ALL
        SELECT t.tenant_id, 'multi', count(DISTINCT t.action_key), 0, NULL
        FROM replaysafe.action_attempts t
        WHERE t.outcome = 'succeeded' AND t.superseded
          AND EXISTS (SELECT 1 FROM replaysafe.action_attempts o
                      WHERE o.tenant_id = t.tenant_id AND o.action_key = t.action_key
                        AND o.attempt <> t.attempt AND o.outcome = 'succeeded')
        GROUP BY t.tenant_id
    ), labelled AS (
        SELECT CASE WHEN p_by_tenant THEN p.tenant_id END AS tenant_id, p.state, p.n,
               p.expired, p.oldest
        FROM per p
    ), tenants AS (
        SELECT l.tenant_id,
               sum(l.n) FILTER (WHERE l.state = 'running') AS running,
               sum(l.expired) FILTER (WHERE l.state = 'running') AS expired,
               sum(l.n) FILTER (WHERE l.state = 'unknown') AS unknown,
               sum(l.n) FILTER (WHERE l.state = 'retryable') AS retryable,
               sum(l.n) FILTER (WHERE l.state = 'multi') AS multi,
               min(l.oldest) FILTER (WHERE l.state IN ('running', 'unknown')) AS oldest
        FROM labelled l GROUP BY l.tenant_id
        -- The totals row exists even when nothing is running anywhere.
        UNION ALL
        SELECT NULL, 0, 0, 0, 0, 0, NULL
        WHERE p_by_tenant OR NOT EXISTS (SELECT 1 FROM labelled)
    ), totals AS (
        SELECT t.tenant_id, coalesce(sum(t.running), 0) AS running,
               coalesce(sum(t.expired), 0) AS expired, coalesce(sum(t.unknown), 0) AS unknown,
               coalesce(sum(t.retryable), 0) AS retryable, coalesce(sum(t.multi), 0) AS multi,
               min(t.oldest) AS oldest
        FROM tenants t GROUP BY t.tenant_id
    )
    SELECT m.name, t.tenant_id, m.state, m.value
    FROM totals t CROSS JOIN LATERAL (VALUES
        ('replaysafe_actions', 'running', t.running::double precision),
        ('replaysafe_actions', 'unknown', t.unknown::double precision),
        ('replaysafe_actions', 'retryable', t.retryable::double precision),
        ('replaysafe_unresolved_actions', NULL, (t.unknown + t.expired)::double precision),
        ('replaysafe_oldest_unresolved_age_seconds', NULL,
         coalesce(extract(epoch FROM p_now - t.oldest), 0)::double precision),
        ('replaysafe_multi_effect_actions', NULL, t.multi::double precision),
        ('replaysafe_expired_leases', NULL, t.expired::double precision)) m(name, state, value)
    -- With per-tenant labels the all-zero totals row only stands in for an empty installation.
    WHERE t.tenant_id IS NOT NULL OR NOT p_by_tenant
       OR NOT EXISTS (SELECT 1 FROM totals o WHERE o.tenant_id IS NOT NULL)
    UNION ALL
    SELECT e.name, NULL, e.state, e.value FROM (VALUES
        ('replaysafe_actions', 'succeeded', replaysafe._estimate('replaysafe.actions',
            'SELECT 1 FROM replaysafe.actions x WHERE x.state = ''succeeded''')),
        ('replaysafe_actions', 'failed', replaysafe._estimate('replaysafe.actions',
            'SELECT 1 FROM replaysafe.actions x WHERE x.state = ''failed''')),
        ('replaysafe_threads', NULL, replaysafe._estimate('replaysafe.threads',
            'SELECT 1 FROM replaysafe.threads t WHERE NOT t.deleted'))) e(name, state, value)
    WHERE e.value IS NOT NULL;
END
$$;

-- What purge_actions and purge_threads check before anything: the operator duty (EXECUTE is
-- the operators'; a grant to another role by mistake must not open it: with a tenant grant,
-- the grant's and the role's duties are checked with the tenant), p_older_than, p_limit and
-- p_now. Returns p_now, checked.
CREATE OR REPLACE FUNCTION replaysafe._check_purge(p_older_than interval, p_limit integer,
                                                   p_now timestamptz, p_grant text,
                                                   p_duty text)
RETURNS timestamptz
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_grant IS NULL AND NOT EXISTS (SELECT 1 FROM replaysafe._caller_scope c
                                       WHERE c.owner_or_operator) THEN
        PERFORM replaysafe._raise('RS004', 'access denied: ' || p_duty || ' replaysafe_operator''s duty');
    END IF;
    IF p_older_than IS NULL OR p_older_than < interval '0' OR p_older_than > interval '1000 years' THEN
        PERFORM replaysafe._invalid('p_older_than', 'must be a non-negative interval of at most 1000 years');
    END IF;
    IF p_limit IS NULL OR p_limit < 1 THEN
        PERFORM replaysafe._invalid('p_limit', 'must be a positive integer');
    END IF;
    IF (p_now BETWEEN clock_timestamp() - interval '5 minutes' AND clock_timestamp()) IS NOT TRUE THEN
        p_now := replaysafe._check_now(p_now, p_grant);
    END IF;
    RETURN p_now;
END
$$;

-- Age-based retention (operator): threads and LangGraph threads not written for
-- p_older_than, at most p_limit threads of each kind per call, of the caller's tenant
-- (p_tenant_id, the grant's tenant, or every tenant for the unbound owner and roles bound
-- to all tenants). A purged thread keeps its head row as a tombstone with its version
-- counter moved on, exactly as delete_thread leaves it, so a version is never reused; a
-- purged LangGraph thread is deleted as langgraph_delete_thread deletes it. Threads locked
-- by a writer are skipped, never waited for. Returns the number of threads purged.
CREATE OR REPLACE FUNCTION replaysafe.purge_threads(
    p_older_than interval,
    p_limit      integer     DEFAULT 10000,
    p_now        timestamptz DEFAULT clock_timestamp(),
    p_tenant_id  text        DEFAULT NULL,
    p_grant      text        DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_tenant  text;
    v_all     boolean;
    v_cutoff  timestamptz;
    v_count   integer := 0;
    v_n       integer;
    v_tenants text[];
    v_threads text[];
BEGIN
    p_now := replaysafe._check_purge(p_older_than, p_limit, p_now, p_grant, 'purging threads is');
    IF p_grant IS NOT NULL
       AND replaysafe._acts_with_grant(p_tenant_id, p_grant, '{operator}') ->> 'sub' IS NOT NULL THEN
        PERFORM replaysafe._raise('RS004', 'access denied: a grant that names a user cannot '
                                           'purge the tenant''s threads');
    END IF;
    SELECT t.tenant_id, t.acts_for_all INTO v_tenant, v_all
    FROM replaysafe._sweep_scope(p_tenant_id, p_grant, '{operator}') t;
    IF v_tenant IS NULL AND NOT v_all THEN
        RETURN 0;
    END IF;
    v_cutoff := p_now - p_older_than;
    PERFORM replaysafe._durable();

    -- Versioned threads: the oldest live heads not written since the cutoff, locked. Found
    -- by a scan of the heads: an index on updated_at would make every write_thread's update
    -- of its head row a non-HOT one.
    SELECT array_agg(d.tenant_id), array_agg(d.thread_id) INTO v_tenants, v_threads
    FROM (SELECT x.tenant_id, x.thread_id FROM replaysafe.threads x
          WHERE NOT x.deleted AND x.updated_at < v_cutoff
            AND (v_tenant IS NULL OR x.tenant_id = v_tenant)
          ORDER BY x.updated_at LIMIT p_limit FOR UPDATE SKIP LOCKED) d;
    IF v_threads IS NOT NULL THEN
        WITH victims AS (
            UPDATE replaysafe.threads x
            SET version = x.version + 1, deleted = true, oldest_kept = x.version + 2,
                updated_at = clock_timestamp()
            FROM unnest(v_tenants, v_threads) AS k(tenant_id, thread_id)
            WHERE x.tenant_id = k.tenant_id AND x.thread_id = k.thread_id
            RETURNING x.tenant_id, x.thread_id, x.version AS tombstone
        ), gone AS (
            DELETE FROM replaysafe.thread_versions v
            USING victims k
            WHERE v.tenant_id = k.tenant_id AND v.thread_id = k.thread_id
              AND v.version < k.tombstone
            RETURNING 1
        )
        SELECT count(*) INTO v_n FROM victims;
        v_count := v_count + v_n;
    END IF;

    -- LangGraph threads no namespace of which was written since the cutoff, found by a scan
    -- of the threads (written_at is not indexed: a put's update of the head stays HOT), each
    -- taken by its lock row, skipped when a writer holds it (a put or pending write in flight,
    -- also into a namespace no snapshot shows yet). Once this call holds it, writers wait; a
    -- thread is kept if one wrote to it before that (checked in a statement whose snapshot is
    -- taken after the locks), or if another transaction holds one of its namespaces.
    SELECT array_agg(d.tenant_id), array_agg(d.thread_id) INTO v_tenants, v_threads
    FROM (SELECT t.tenant_id, t.thread_id FROM replaysafe.langgraph_threads t
          WHERE (v_tenant IS NULL OR t.tenant_id = v_tenant)
            AND NOT EXISTS (SELECT 1 FROM replaysafe.langgraph_namespaces n
                            WHERE n.tenant_id = t.tenant_id AND n.thread_id = t.thread_id
                              AND n.written_at >= v_cutoff)
          LIMIT p_limit
          FOR UPDATE SKIP LOCKED) d;
    IF v_threads IS NOT NULL THEN
        SELECT array_agg(v.tenant_id), array_agg(v.thread_id) INTO v_tenants, v_threads
        FROM unnest(v_tenants, v_threads) AS v(tenant_id, thread_id)
        WHERE NOT EXISTS (SELECT 1 FROM replaysafe.langgraph_namespaces n
                          WHERE n.tenant_id = v.tenant_id AND n.thread_id = v.thread_id
                            AND n.written_at >= v_cutoff)
          AND (SELECT count(*) FROM replaysafe.langgraph_namespaces n
               WHERE n.tenant_id = v.tenant_id AND n.thread_id = v.thread_id)
            = (SELECT count(*) FROM (SELECT 1 FROM replaysafe.langgraph_namespaces n
                                     WHERE n.tenant_id = v.tenant_id AND n.thread_id = v.thread_id
                                     ORDER BY n.checkpoint_ns
                                     FOR UPDATE SKIP LOCKED) l);
    END IF;
    IF v_threads IS NOT NULL THEN
        WITH k AS (SELECT * FROM unnest(v_tenants, v_threads) AS k(tenant_id, thread_id)),
        c AS (DELETE FROM replaysafe.langgraph_checkpoints x USING k
              WHERE x.tenant_id = k.tenant_id AND x.thread_id = k.thread_id RETURNING 1),
        w AS (DELETE FROM replaysafe.langgraph_writes x USING k
              WHERE x.tenant_id = k.tenant_id AND x.thread_id = k.thread_id RETURNING 1),
        b AS (DELETE FROM replaysafe.langgraph_blobs x USING k
              WHERE x.tenant_id = k.tenant_id AND x.thread_id = k.thread_id RETURNING 1),
        n AS (DELETE FROM replaysafe.langgraph_namespaces x USING k
              WHERE x.tenant_id = k.tenant_id AND x.thread_id = k.thread_id RETURNING 1),
        u AS (DELETE FROM replaysafe.langgraph_thread_users x USING k
              WHERE x.tenant_id = k.tenant_id AND x.thread_id = k.thread_id RETURNING 1),
        t AS (DELETE FROM replaysafe.langgraph_threads x USING k
              WHERE x.tenant_id = k.tenant_id AND x.thread_id = k.thread_id RETURNING 1)
        SELECT count(*) INTO v_n FROM k;
        v_count := v_count + v_n;
    END IF;
    RETURN v_count;
END
$$;

-- Who is calling: the caller's role and tenant, for the functions (_caller, _caller_scope)
-- and for the views (_reader). See sql/functions/tenancy.sql.

CREATE OR REPLACE VIEW replaysafe._caller AS
SELECT r.role_name,
       CASE WHEN p.restricted THEN NULL ELSE replaysafe._binding() END AS tenant_id,  -- see them
       p.restricted
FROM (SELECT CASE WHEN current_setting('role') = 'none' THEN session_user::text
                  ELSE current_setting('role') END AS role_name) r,
     LATERAL (SELECT replaysafe._in_restricted_operation() AS restricted) p;

-- The caller's wider rights, for the functions (never needed on a bound caller's hot path).
-- It is the owner when it is the schema owner or an explicit member of it (pg_auth_members:
-- unlike pg_has_role(), a superuser is not a member of every role, so an unbound superuser
-- that is not the schema owner acts for no tenant), and not inside a security-restricted
-- operation; unbound, the owner acts for every tenant, and so does a session whose current
-- role or login bind_role_to_all_tenants() named (by OID and name: a renamed role, or a
-- node where another role has that OID, fails closed); the owner and replaysafe_operator
-- members may pass a p_now far from the clock. (No parameters, no pg_roles: one cached plan,
-- syscache probes.)
CREATE OR REPLACE VIEW replaysafe._caller_scope AS
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
       me.tenant_id IS NULL AND (s.is_owner OR (NOT me.restricted AND EXISTS (
           SELECT 1 FROM replaysafe.all_tenant_roles a
           WHERE (a.role_oid, a.role_name) IN ((me.role_oid, me.role_name),
                                               (to_regrole(quote_ident(session_user::text))::oid,
                                                session_user::text)))))
           AS acts_for_all,
       s.is_owner OR (NOT me.restricted AND me.role_oid IN (SELECT o.roleid FROM operators o))
           AS owner_or_operator
FROM me
CROSS JOIN LATERAL (SELECT NOT me.restricted AND me.role_oid IN (SELECT o.roleid FROM owners o)
                        AS is_owner) s;

-- Who is reading a view: a view does not switch user, so current_user is the reader (in a
-- security-restricted operation, the code's owner, not the session's login). Its tenant is
-- its binding, else its login's, else that of the grant use_grant put in force in this
-- transaction (grant_in_force; its user, if it names one, limits threads_v to that user's
-- threads); unbound and without a grant, it reads every tenant when it is a member of the
-- schema owner or bind_role_to_all_tenants() named it (or its login, as for the login's
-- binding), and nothing otherwise, whatever its groups. (Pure SQL: a view may call no
-- private helper.)
CREATE OR REPLACE VIEW replaysafe._reader AS
SELECT coalesce(r.tenant_id, g.tenant_id) AS tenant_id,
       CASE WHEN r.tenant_id IS NOT NULL OR g.tenant_id IS NOT NULL THEN false
            -- A group role itself never reads every tenant: code a tenant made it own (after
            -- SET ROLE) may run in anyone's session.
            WHEN current_user IN ('replaysafe_worker', 'replaysafe_operator', 'replaysafe_auditor',
                                  'replaysafe_issuer')
                THEN false
            ELSE pg_has_role(current_user, n.nspowner, 'USAGE')
                 -- Only for the session's own current role (or its login), never for code
                 -- an all-tenant role owns running in someone else's session.
                 OR (current_user::text = CASE WHEN current_setting('role') = 'none'
                                               THEN session_user::text
                                               ELSE current_setting('role') END
                     AND EXISTS (SELECT 1 FROM replaysafe.all_tenant_roles a
                                 WHERE (a.role_oid = to_regrole(quote_ident(current_user))::oid
                                        AND a.role_name = current_user::text)
                                    OR (a.role_oid = to_regrole(quote_ident(session_user))::oid
                                        AND a.role_name = session_user::text)))
            END AS reads_all,
       g.user_id
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
          AS tenant_id) r
     -- Only for the session's own current role, as the login's binding above.
     LEFT JOIN LATERAL (SELECT f.tenant_id, f.user_id FROM replaysafe.grant_in_force() f
                        WHERE current_user::text = CASE WHEN current_setting('role') = 'none'
                                                        THEN session_user::text
                                                        ELSE current_setting('role') END) g
            ON true,
     pg_namespace n
WHERE n.nspname = 'replaysafe'
  -- Always true, and parallel unsafe: no query through the views starts parallel workers.
  -- They cost ~15 ms of start-up at 1 M actions and more, against ~2 ms for a tenant's rows,
  -- and the planner, counting every tenant's rows in the readers-of-everything branch,
  -- would start them for any aggregate over a tenant.
  AND pg_current_xact_id_if_assigned() IS DISTINCT FROM '0'::xid8;

-- ---------------------------------------------------------------------------------------
-- Audit views: owner-rights (they read the private tables) and security_barrier (a reader's
-- own functions in a WHERE clause never see rows the filter removes). Each shows the
-- reader's tenant only (every tenant to the unbound owner and unbound auditors), or the
-- tenant of the grant use_grant put in force.
--
-- The private _visible_* views do the filtering as a UNION ALL: the reader's tenant as an
-- index condition (a reader's own conditions join it, so no row of another tenant is ever
-- read: EXPLAIN ANALYZE cannot confirm another tenant's key by "Rows Removed by Filter"),
-- and every row behind a one-time test of reads_all, never executed for anyone else.
-- ---------------------------------------------------------------------------------------

-- The first attempt of an action has no row in action_attempts while the action row says
-- all there is to say about it: a claim writes one row, its report updates one row (the
-- extra row cost a third of a claim+complete's WAL). Its row is written, from the action
-- row, by _keep_first_attempt before anything but that attempt's own report changes the
-- action (expiry, a second attempt, an operator's resolve or reopen, a late or superseded
-- report); until then the audit view shows the row derived here (action_attempts_v).
CREATE OR REPLACE VIEW replaysafe._first_attempts AS
SELECT x.tenant_id, x.action_key, x.attempt, x.worker_id, x.created_at AS claimed_at,
       CASE WHEN x.state <> 'running' THEN x.updated_at END AS ended_at,
       CASE WHEN x.state <> 'running' THEN x.state END AS outcome,
       false AS superseded, x.error, x.result, x.provider_reference, x.attempt_token_hash
FROM replaysafe.actions x
WHERE x.attempt = 1
  AND NOT EXISTS (SELECT 1 FROM replaysafe.action_attempts t
                  WHERE t.tenant_id = x.tenant_id AND t.action_key = x.action_key
                    AND t.attempt = 1);

CREATE OR REPLACE VIEW replaysafe._visible_actions WITH (security_barrier = true) AS
SELECT x.* FROM replaysafe.actions x
WHERE x.tenant_id = (SELECT r.tenant_id FROM replaysafe._reader r)
UNION ALL
SELECT x.* FROM replaysafe.actions x
WHERE (SELECT r.reads_all FROM replaysafe._reader r);

CREATE OR REPLACE VIEW replaysafe._visible_attempts WITH (security_barrier = true) AS
SELECT t.* FROM replaysafe.action_attempts t
WHERE t.tenant_id = (SELECT r.tenant_id FROM replaysafe._reader r)
UNION ALL
SELECT t.* FROM replaysafe.action_attempts t
WHERE (SELECT r.reads_all FROM replaysafe._reader r);

-- Under a grant that names a user, that user's threads only.
CREATE OR REPLACE VIEW replaysafe._visible_threads WITH (security_barrier = true) AS
SELECT t.* FROM replaysafe.threads t
WHERE t.tenant_id = (SELECT r.tenant_id FROM replaysafe._reader r)
  AND ((SELECT r.user_id FROM replaysafe._reader r) IS NULL
       OR t.user_id = (SELECT r.user_id FROM replaysafe._reader r))
UNION ALL
SELECT t.* FROM replaysafe.threads t
WHERE (SELECT r.reads_all FROM replaysafe._reader r);

CREATE OR REPLACE VIEW replaysafe.actions_v WITH (security_barrier = true) AS
SELECT x.tenant_id, x.action_key, x.thread_id, x.operation, x.state, x.attempt, x.on_expired,
       x.idempotency_key, x.request, x.result, x.error, x.provider_reference, x.lease_expires_at,
       x.created_at, x.updated_at, x.completed_at, x.worker_id, x.resolution_note, x.resolved_at
FROM replaysafe._visible_actions x;

-- First attempts without a row of their own (_first_attempts), filtered as above.
CREATE OR REPLACE VIEW replaysafe._visible_first_attempts WITH (security_barrier = true) AS
SELECT f.* FROM replaysafe._first_attempts f
WHERE f.tenant_id = (SELECT r.tenant_id FROM replaysafe._reader r)
UNION ALL
SELECT f.* FROM replaysafe._first_attempts f
WHERE (SELECT r.reads_all FROM replaysafe._reader r);

CREATE OR REPLACE VIEW replaysafe.action_attempts_v WITH (security_barrier = true) AS
SELECT t.tenant_id, t.action_key, t.attempt, t.worker_id, t.claimed_at, t.ended_at, t.outcome,
       t.superseded, t.error, t.result, t.provider_reference
FROM replaysafe._visible_attempts t
UNION ALL
SELECT f.tenant_id, f.action_key, f.attempt, f.worker_id, f.claimed_at, f.ended_at, f.outcome,
       f.superseded, f.error, f.result, f.provider_reference
FROM replaysafe._visible_first_attempts f;

CREATE OR REPLACE VIEW replaysafe.unresolved_actions WITH (security_barrier = true) AS
SELECT x.tenant_id, x.action_key, x.operation, x.state, x.lease_expires_at,
       now() - CASE WHEN x.state = 'running' THEN x.lease_expires_at ELSE x.updated_at END AS age,
       x.thread_id, x.created_at, x.updated_at
FROM replaysafe._visible_actions x
WHERE x.state = 'unknown' OR (x.state = 'running' AND x.lease_expires_at <= now());

CREATE OR REPLACE VIEW replaysafe.multi_effect_actions WITH (security_barrier = true) AS
SELECT m.tenant_id, m.action_key, a.operation, m.successful_attempts
FROM (SELECT t.tenant_id, t.action_key, count(*) AS successful_attempts
      FROM replaysafe._visible_attempts t
      WHERE t.outcome = 'succeeded'
      GROUP BY t.tenant_id, t.action_key
      HAVING count(*) > 1) m
-- One primary-key lookup per multi-effect action (LIMIT keeps the planner from a hash join
-- that reads every tenant's actions).
CROSS JOIN LATERAL (SELECT x.operation FROM replaysafe.actions x
                    WHERE x.tenant_id = m.tenant_id AND x.action_key = m.action_key LIMIT 1) a;

-- Ownership by user id is enforced by the functions; the view shows every thread of the
-- reader's tenant (under a grant that names a user, that user's threads).
CREATE OR REPLACE VIEW replaysafe.threads_v WITH (security_barrier = true) AS
SELECT t.tenant_id, t.thread_id, t.user_id, t.version, t.deleted, v.state, t.history_limit,
       t.created_at, t.updated_at
FROM replaysafe._visible_threads t
LEFT JOIN replaysafe.thread_versions v
       ON v.tenant_id = t.tenant_id AND v.thread_id = t.thread_id AND v.version = t.version;

-- The group roles and their privileges: EXECUTE on the public functions, SELECT on the audit
-- views, USAGE on the schema; nothing on a table or a private helper. Applied with the
-- function set after every revision step (a dropped and re-created function lost its
-- grants).

-- Group roles, created only where the migrating role may create roles. Roles are
-- cluster-wide, so another database may have created them already.
DO $roles$
DECLARE
    r text;
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = current_user
               AND (rolsuper OR rolcreaterole)) THEN
        FOREACH r IN ARRAY ARRAY['replaysafe_worker', 'replaysafe_operator', 'replaysafe_auditor',
                                 'replaysafe_issuer'] LOOP
            BEGIN
                IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = r) THEN
                    EXECUTE pg_catalog.format('CREATE ROLE %I NOLOGIN', r);
                END IF;
            EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
            END;
        END LOOP;
    END IF;
END
$roles$;

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

-- What each group role may call and read, by function name (the function set defines one
-- signature per name). A role that does not exist (the migrating role may not create roles)
-- is skipped; a name that matches no function, or a view that is not there, stops the step.
DO $grants$
DECLARE
    r record;
    f pg_catalog.regprocedure;
    v_name text;
BEGIN
    FOR r IN
        SELECT d.role, d.functions, d.views FROM (VALUES
            (1, 'replaysafe_worker',
             ARRAY['claim_action', 'claim_actions', 'heartbeat_action', 'complete_action',
                   'fail_action', 'mark_action_unknown', 'sweep_expired_actions',
                   'read_thread', 'write_thread', 'thread_history', 'delete_thread',
                   'installed_revision',
                   'langgraph_put', 'langgraph_put_writes', 'langgraph_get_tuple', 'langgraph_list',
                   'langgraph_delete_thread', 'langgraph_delete_for_runs', 'langgraph_copy_thread',
                   'langgraph_prune', 'use_grant', 'grant_in_force', 'acting_for', 'metrics'],
             ARRAY['actions_v', 'action_attempts_v', 'unresolved_actions', 'multi_effect_actions',
                   'threads_v']),
            (2, 'replaysafe_auditor',
             ARRAY['installed_revision', 'use_grant', 'grant_in_force', 'acting_for', 'metrics'],
             ARRAY['actions_v', 'action_attempts_v', 'unresolved_actions', 'multi_effect_actions',
                   'threads_v']),
            (3, 'replaysafe_operator',
             ARRAY['resolve_action', 'reopen_action', 'purge_actions', 'sweep_expired_actions',
                   'installed_revision', 'use_grant', 'grant_in_force', 'revoke_tenant_grants',
                   'acting_for', 'metrics', 'purge_threads'],
             ARRAY['actions_v', 'action_attempts_v', 'unresolved_actions', 'multi_effect_actions',
                   'threads_v']),
            -- The issuer signs grants and does nothing else: no view, no ledger function.
            (4, 'replaysafe_issuer',
             ARRAY['issue_tenant_grant', 'installed_revision'],
             ARRAY[]::text[])) d(ord, role, functions, views)
        WHERE EXISTS (SELECT 1 FROM pg_catalog.pg_roles a WHERE a.rolname = d.role)
        ORDER BY d.ord  -- the order the privileges are listed in (pg_dump shows it)
    LOOP
        EXECUTE pg_catalog.format('GRANT USAGE ON SCHEMA replaysafe TO %I', r.role);
        FOREACH v_name IN ARRAY r.functions LOOP
            f := NULL;
            FOR f IN SELECT p.oid::pg_catalog.regprocedure FROM pg_catalog.pg_proc p
                     WHERE p.pronamespace = 'replaysafe'::pg_catalog.regnamespace AND p.proname = v_name
            LOOP
                EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %I', f, r.role);
            END LOOP;
            IF f IS NULL THEN
                RAISE EXCEPTION 'replaysafe: grants.sql names a function that does not exist: %', v_name;
            END IF;
        END LOOP;
        FOREACH v_name IN ARRAY r.views LOOP
            EXECUTE pg_catalog.format('GRANT SELECT ON %s TO %I',
                                      pg_catalog.format('replaysafe.%I', v_name)::pg_catalog.regclass, r.role);
        END LOOP;
    END LOOP;
END
$grants$;

-- The functions of the schema are exactly the set's: a signature changed by a revision
-- that did not DROP the old one is refused here, with the whole step.
DO $function_set$
DECLARE
    v_expected pg_catalog.regprocedure[] := ARRAY[
        'replaysafe._raise(text, text, text)',
        'replaysafe._invalid(text, text)',
        'replaysafe._check_id(text, text, boolean)',
        'replaysafe._check_now(timestamptz, text, boolean)',
        'replaysafe._durable()',
        'replaysafe._long_number(jsonb, bigint)',
        'replaysafe._oversize(jsonb, bigint, bigint)',
        'replaysafe._check_size(text, jsonb, text, bigint, bigint)',
        'replaysafe._check_bytes(text, bigint, text, bigint)',
        'replaysafe._in_restricted_operation()',
        'replaysafe._binding()',
        'replaysafe._acts_for(text, text, text[], boolean)',
        'replaysafe._role_to_bind(text)',
        'replaysafe.bind_role_to_tenant(text, text)',
        'replaysafe.unbind_role(text)',
        'replaysafe.bind_role_to_all_tenants(text)',
        'replaysafe.installed_revision()',
        'replaysafe.acting_for(text)',
        'replaysafe.idempotency_key(text, text)',
        'replaysafe._attempt_token(text, text, integer, text)',
        'replaysafe._keep_first_attempt(text, text)',
        'replaysafe._transaction_began(timestamptz)',
        'replaysafe.claim_action(text, text, text, jsonb, text, interval, text, text, timestamptz, text, text)',
        'replaysafe._claim_locked(text, text, text, jsonb, text, interval, text, text, timestamptz, text, text)',
        'replaysafe._expire_attempt(replaysafe.actions, timestamptz)',
        'replaysafe.claim_actions(text, text[], text[], jsonb[], text, interval, text, text, timestamptz, text[], text)',
        'replaysafe._check_attempt_token(text, text, integer, bytea)',
        'replaysafe.heartbeat_action(text, text, integer, text, interval, timestamptz, text)',
        'replaysafe._report(text, text, integer, text, replaysafe.action_state, jsonb, jsonb, text, timestamptz, text)',
        'replaysafe.complete_action(text, text, integer, text, jsonb, text, timestamptz, text)',
        'replaysafe.fail_action(text, text, integer, text, jsonb, boolean, timestamptz, text)',
        'replaysafe.mark_action_unknown(text, text, integer, text, jsonb, timestamptz, text)',
        'replaysafe.resolve_action(text, text, text, jsonb, jsonb, text, text, timestamptz, integer, text)',
        'replaysafe.reopen_action(text, text, text, timestamptz, text)',
        'replaysafe._sweep_scope(text, text, text[])',
        'replaysafe._due_actions(integer, timestamptz, timestamptz)',
        'replaysafe.sweep_expired_actions(integer, timestamptz, text, text)',
        'replaysafe.purge_actions(interval, integer, timestamptz, text, text)',
        'replaysafe._base64url(bytea)',
        'replaysafe._hmac_pads(bytea)',
        'replaysafe._hmac_sha256(bytea, bytea)',
        'replaysafe._new_grant_key()',
        'replaysafe._acts_with_grant(text, text, text[], boolean)',
        'replaysafe._grant_user(text, text)',
        'replaysafe.issue_tenant_grant(text, interval, text, text[])',
        'replaysafe.revoke_tenant_grants(text, text)',
        'replaysafe.rotate_grant_key(boolean)',
        'replaysafe.use_grant(text)',
        'replaysafe._grant_seal(text)',
        'replaysafe.grant_in_force()',
        'replaysafe._check_thread_args(text, text, text)',
        'replaysafe._deny_thread()',
        'replaysafe._stale_thread(text, bigint, bigint)',
        'replaysafe.read_thread(text, text, text, text)',
        'replaysafe.write_thread(text, text, bigint, jsonb, text, integer, text)',
        'replaysafe.thread_history(text, text, text, integer, text)',
        'replaysafe.delete_thread(text, text, text, text)',
        'replaysafe._langgraph_check_args(text, text, text)',
        'replaysafe._langgraph_check_keys(bigint, bigint, bigint, text[], text[])',
        'replaysafe._langgraph_check_blobs(text, bytea[], text, bigint)',
        'replaysafe._langgraph_hold_thread(text, text)',
        'replaysafe._langgraph_user_thread(text, text, text, boolean)',
        'replaysafe._langgraph_namespace(text, text, text, boolean)',
        'replaysafe._langgraph_head(text, text, text, text)',
        'replaysafe._langgraph_collect_blobs(text, text, text)',
        'replaysafe.langgraph_put(text, text, text, text, text, jsonb, jsonb, text[], text[], text[], bytea[], integer, text)',
        'replaysafe.langgraph_put_writes(text, text, text, text, text, text, integer[], text[], text[], bytea[], boolean, text)',
        'replaysafe.langgraph_get_tuple(text, text, text, text, text)',
        'replaysafe.langgraph_list(text, text, text, text, jsonb, text, integer, text)',
        'replaysafe.langgraph_delete_thread(text, text, text)',
        'replaysafe.langgraph_delete_for_runs(text, text[], text)',
        'replaysafe.langgraph_copy_thread(text, text, text, text)',
        'replaysafe.langgraph_prune(text, text[], text, text)',
        'replaysafe._estimate(regclass, text)',
        'replaysafe.metrics(boolean, timestamptz, text)',
        'replaysafe._check_purge(interval, integer, timestamptz, text, text)',
        'replaysafe.purge_threads(interval, integer, timestamptz, text, text)'
    ]::pg_catalog.regprocedure[];
    v_left text;
    r record;
BEGIN
    SELECT pg_catalog.string_agg(p.oid::pg_catalog.regprocedure::text, ', '
                                  ORDER BY p.oid::pg_catalog.regprocedure::text) INTO v_left
    FROM pg_catalog.pg_proc p
    WHERE p.pronamespace OPERATOR(pg_catalog.=) 'replaysafe'::pg_catalog.regnamespace
      AND p.oid OPERATOR(pg_catalog.<>) ALL (v_expected::pg_catalog.oid[]);
    IF v_left IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '42723', MESSAGE = pg_catalog.concat(
            'replaysafe: the schema holds functions its function set does not define: ', v_left,
            ' (a revision that changes a signature drops the old one)');
    END IF;
    -- Every body compiles, now that every function and view exists.
    PERFORM pg_catalog.set_config('check_function_bodies', 'on', true);
    FOR r IN
        SELECT p.oid, l.lanvalidator::pg_catalog.regproc AS validator
        FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_language l ON l.oid OPERATOR(pg_catalog.=) p.prolang
        WHERE p.oid OPERATOR(pg_catalog.=) ANY (v_expected::pg_catalog.oid[])
          AND l.lanvalidator OPERATOR(pg_catalog.<>) 0
    LOOP
        EXECUTE pg_catalog.format('SELECT %s(%s)', r.validator, r.oid);
    END LOOP;
END
$function_set$;
SELECT pg_catalog.set_config('check_function_bodies',
                             pg_catalog.current_setting('replaysafe.outer_check_function_bodies'), true);

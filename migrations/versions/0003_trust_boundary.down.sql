-- Downgrade of 0003: back to the 0002 interface (SECURITY INVOKER functions, row-level
-- security policies, table privileges for the group roles). Data is kept; actions created
-- under 0003 keep their salted idempotency keys. The definitions below are 0002's, as
-- pg_dump printed them from a database at 0002.
SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
SELECT pg_catalog.set_config('check_function_bodies', 'false', true);

DROP VIEW replaysafe.actions_v, replaysafe.action_attempts_v, replaysafe.unresolved_actions,
    replaysafe.multi_effect_actions, replaysafe.threads_v, replaysafe._caller_scope,
    replaysafe._visible_actions, replaysafe._visible_attempts, replaysafe._visible_threads,
    replaysafe._reader, replaysafe._caller;
DO $drop$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT p.oid::pg_catalog.regprocedure AS f FROM pg_catalog.pg_proc p
             JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
             WHERE n.nspname = 'replaysafe' LOOP
        EXECUTE 'DROP FUNCTION ' || r.f::text;
    END LOOP;
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'replaysafe_operator') THEN
        REVOKE ALL ON SCHEMA replaysafe FROM replaysafe_operator;
        REVOKE ALL ON ALL TABLES IN SCHEMA replaysafe FROM replaysafe_operator;
    END IF;
END
$drop$;
DROP TABLE replaysafe.installation;
-- Bindings by name again (names were unique under 0002: keep the newest of any repeat).
DELETE FROM replaysafe.role_bindings b USING replaysafe.role_bindings o
WHERE b.role_name = o.role_name AND b.bound_at < o.bound_at;
ALTER TABLE replaysafe.role_bindings DROP CONSTRAINT role_bindings_pkey,
    ADD CONSTRAINT role_bindings_pkey PRIMARY KEY (role_name);
ALTER TABLE replaysafe.role_bindings DROP COLUMN role_oid;

CREATE FUNCTION replaysafe._bound_tenant() RETURNS text
    LANGUAGE sql STABLE
    AS $$
    SELECT b.tenant_id FROM replaysafe.role_bindings b WHERE b.role_name = current_user::text
$$;

CREATE FUNCTION replaysafe._check_id(p_name text, p_value text, p_nullable boolean DEFAULT false) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF p_value IS NULL AND p_nullable THEN
        RETURN;
    END IF;
    IF p_value IS NULL OR length(p_value) NOT BETWEEN 1 AND 512 THEN
        PERFORM replaysafe._raise('RS005', format(
            'invalid argument %s: must be non-empty text of at most 512 characters (got %s)',
            p_name, CASE WHEN p_value IS NULL THEN 'NULL'
                         ELSE length(p_value)::text || ' characters' END));
    END IF;
END
$$;

CREATE FUNCTION replaysafe._check_thread_args(p_tenant_id text, p_thread_id text, p_user_id text) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM replaysafe._check_id('p_tenant_id', p_tenant_id);
    PERFORM replaysafe._check_id('p_thread_id', p_thread_id);
    PERFORM replaysafe._check_id('p_user_id', p_user_id, true);
END
$$;

CREATE FUNCTION replaysafe._claim_locked(p_tenant_id text, p_action_key text, p_operation text, p_request jsonb, p_worker_id text, p_lease interval, p_thread_id text, p_on_expired text, p_now timestamp with time zone) RETURNS replaysafe.claim_record
    LANGUAGE plpgsql
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
        RETURN replaysafe._claim_record('replay', a);
    ELSIF a.state = 'unknown' THEN
        RETURN replaysafe._claim_record('unknown', a);
    ELSIF a.state = 'running' AND a.lease_expires_at > p_now THEN
        IF NOT a.has_waiters THEN
            UPDATE replaysafe.actions x SET has_waiters = true
            WHERE x.tenant_id = p_tenant_id AND x.action_key = p_action_key;
        END IF;
        RETURN replaysafe._claim_record('running', a);
    ELSIF a.state = 'running' THEN
        -- The lease ran out and nobody noticed yet: the attempt's effect is unknown.
        PERFORM replaysafe._expire_attempt(a, p_now);
        IF a.on_expired = 'unknown' THEN
            UPDATE replaysafe.actions x SET state = 'unknown', updated_at = p_now
            WHERE x.tenant_id = p_tenant_id AND x.action_key = p_action_key
            RETURNING * INTO a;
            RETURN replaysafe._claim_record('unknown', a);
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
    RETURN replaysafe._claim_record('claimed', a);
END
$$;

SET default_tablespace = '';

SET default_table_access_method = heap;

CREATE FUNCTION replaysafe._claim_record(p_outcome text, a replaysafe.actions) RETURNS replaysafe.claim_record
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT ROW(p_outcome, a.state, a.attempt, a.lease_expires_at, a.result, a.error,
               a.idempotency_key, a.provider_reference)::replaysafe.claim_record
$$;

CREATE FUNCTION replaysafe._deny_tenant() RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM replaysafe._raise('RS004', 'access denied: this role may not act for that tenant');
END
$$;

CREATE FUNCTION replaysafe._deny_thread() RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM replaysafe._raise('RS004', 'access denied: this user may not use that thread');
END
$$;

CREATE FUNCTION replaysafe._expire_attempt(a replaysafe.actions, p_now timestamp with time zone) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    UPDATE replaysafe.action_attempts t
    SET outcome = 'unknown', ended_at = p_now,
        error = jsonb_build_object('reason', 'lease_expired', 'lease_expires_at', a.lease_expires_at)
    WHERE t.tenant_id = a.tenant_id AND t.action_key = a.action_key AND t.attempt = a.attempt;
    IF a.has_waiters THEN
        PERFORM pg_notify('replaysafe_actions', a.idempotency_key);
    END IF;
END
$$;

CREATE FUNCTION replaysafe._id_ok(p_value text) RETURNS boolean
    LANGUAGE sql IMMUTABLE
    AS $_$ SELECT $1 IS NOT NULL AND length($1) BETWEEN 1 AND 512 $_$;

CREATE FUNCTION replaysafe._invalid(p_name text, p_rule text) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM replaysafe._raise('RS005', format('invalid argument %s: %s', p_name, p_rule));
END
$$;

CREATE FUNCTION replaysafe._raise(p_sqlstate text, p_message text, p_detail text DEFAULT NULL::text) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF p_detail IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = p_sqlstate, MESSAGE = p_message;
    END IF;
    RAISE EXCEPTION USING ERRCODE = p_sqlstate, MESSAGE = p_message, DETAIL = p_detail;
END
$$;

CREATE FUNCTION replaysafe._reads_all_tenants() RETURNS boolean
    LANGUAGE sql STABLE
    AS $$
    SELECT NOT EXISTS (SELECT 1 FROM replaysafe.role_bindings b
                       WHERE b.role_name = current_user::text)
       AND EXISTS (SELECT 1 FROM pg_catalog.pg_roles r
                   WHERE r.rolname = 'replaysafe_auditor'
                     AND pg_catalog.pg_has_role(current_user, r.oid, 'MEMBER'))
$$;

CREATE FUNCTION replaysafe._report(p_tenant_id text, p_action_key text, p_attempt integer, p_state replaysafe.action_state, p_result jsonb, p_error jsonb, p_provider_reference text, p_now timestamp with time zone) RETURNS text
    LANGUAGE plpgsql
    AS $$
DECLARE
    a         replaysafe.actions;
    v_outcome text;
    v_final   timestamptz := CASE WHEN p_state IN ('succeeded', 'failed') THEN p_now END;
    v_prior   replaysafe.action_state;
    v_claimed timestamptz;
BEGIN
    IF NOT (replaysafe._id_ok(p_tenant_id) AND replaysafe._id_ok(p_action_key)) THEN
        PERFORM replaysafe._check_id('p_tenant_id', p_tenant_id);
        PERFORM replaysafe._check_id('p_action_key', p_action_key);
    END IF;
    -- Only the public report functions call this, but it is callable: never "running".
    IF p_state IS NULL OR p_state = 'running' THEN
        PERFORM replaysafe._invalid('p_state', 'a report sets succeeded, failed, retryable or unknown');
    END IF;
    IF p_attempt IS NULL OR p_attempt < 1 THEN
        PERFORM replaysafe._invalid('p_attempt', 'must be a positive attempt number');
    END IF;
    IF p_now IS NULL THEN
        PERFORM replaysafe._invalid('p_now', 'must not be NULL');
    END IF;
    IF NOT replaysafe._tenant_ok(p_tenant_id) THEN
        PERFORM replaysafe._deny_tenant();
    END IF;

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
        IF a.has_waiters THEN
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

CREATE FUNCTION replaysafe._stale_thread(p_thread_id text, p_expected bigint, p_current bigint) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM replaysafe._raise('RS003',
        format('stale thread state: thread %s is at version %s, the write expected %s',
               p_thread_id, p_current, p_expected),
        jsonb_build_object('thread_id', p_thread_id, 'expected_version', p_expected,
                           'current_version', p_current)::text);
END
$$;

CREATE FUNCTION replaysafe._tenant_ok(p_tenant_id text) RETURNS boolean
    LANGUAGE sql STABLE
    AS $$
    SELECT CASE WHEN b.tenant_id IS NULL
                THEN pg_catalog.pg_has_role(current_user, n.nspowner, 'USAGE')
                ELSE b.tenant_id = p_tenant_id END
    FROM pg_catalog.pg_namespace n
    LEFT JOIN replaysafe.role_bindings b ON b.role_name = current_user::text
    WHERE n.nspname = 'replaysafe'
$$;

CREATE FUNCTION replaysafe._tenant_or_deny(p_tenant_id text) RETURNS boolean
    LANGUAGE plpgsql STABLE
    AS $$
BEGIN
    IF NOT replaysafe._tenant_ok(p_tenant_id) THEN
        PERFORM replaysafe._deny_tenant();
    END IF;
    RETURN true;
END
$$;

CREATE FUNCTION replaysafe._thread_args_fail(p_tenant_id text, p_thread_id text, p_user_id text) RETURNS boolean
    LANGUAGE plpgsql STABLE
    AS $$
BEGIN
    PERFORM replaysafe._check_thread_args(p_tenant_id, p_thread_id, p_user_id);
    RETURN false;
END
$$;

CREATE FUNCTION replaysafe._thread_deny() RETURNS boolean
    LANGUAGE plpgsql STABLE
    AS $$
BEGIN
    PERFORM replaysafe._deny_thread();
    RETURN false;
END
$$;

CREATE FUNCTION replaysafe.bind_role_to_tenant(p_role text, p_tenant_id text) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF p_role IS NULL OR NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = p_role) THEN
        PERFORM replaysafe._invalid('p_role', 'must name an existing role');
    END IF;
    PERFORM replaysafe._check_id('p_tenant_id', p_tenant_id);
    INSERT INTO replaysafe.role_bindings AS b (role_name, tenant_id)
    VALUES (p_role, p_tenant_id)
    ON CONFLICT (role_name) DO UPDATE SET tenant_id = excluded.tenant_id, bound_at = now();
END
$$;

CREATE FUNCTION replaysafe.claim_action(p_tenant_id text, p_action_key text, p_operation text, p_request jsonb, p_worker_id text, p_lease interval DEFAULT '00:00:30'::interval, p_thread_id text DEFAULT NULL::text, p_on_expired text DEFAULT 'unknown'::text, p_now timestamp with time zone DEFAULT now()) RETURNS replaysafe.claim_record
    LANGUAGE plpgsql
    AS $$
DECLARE
    a       replaysafe.actions;
    v_found boolean;
BEGIN
    IF NOT (replaysafe._id_ok(p_tenant_id) AND replaysafe._id_ok(p_action_key)
            AND replaysafe._id_ok(p_operation) AND replaysafe._id_ok(p_worker_id)
            AND (p_thread_id IS NULL OR replaysafe._id_ok(p_thread_id))) THEN
        PERFORM replaysafe._check_id('p_tenant_id', p_tenant_id);
        PERFORM replaysafe._check_id('p_action_key', p_action_key);
        PERFORM replaysafe._check_id('p_operation', p_operation);
        PERFORM replaysafe._check_id('p_worker_id', p_worker_id);
        PERFORM replaysafe._check_id('p_thread_id', p_thread_id, true);
    END IF;
    IF p_request IS NULL OR jsonb_typeof(p_request) <> 'object' THEN
        PERFORM replaysafe._invalid('p_request', 'must be a JSON object');
    END IF;
    IF p_lease IS NULL OR p_lease <= interval '0' THEN
        PERFORM replaysafe._invalid('p_lease', 'must be a positive interval');
    END IF;
    IF p_on_expired IS NULL OR p_on_expired NOT IN ('unknown', 'reclaim') THEN
        PERFORM replaysafe._invalid('p_on_expired', 'must be ''unknown'' or ''reclaim''');
    END IF;
    IF p_now IS NULL THEN
        PERFORM replaysafe._invalid('p_now', 'must not be NULL');
    END IF;

    -- Fast path, no lock: terminal and unknown actions answer from one read. It answers
    -- only from a row the caller's row-level security lets it read, so the tenant check
    -- (a catalog query, a third of a replay's cost) waits until the claim is about to write.
    SELECT * INTO a FROM replaysafe.actions x
    WHERE x.tenant_id = p_tenant_id AND x.action_key = p_action_key;
    v_found := FOUND;

    IF v_found THEN
        IF a.operation <> p_operation OR a.request <> p_request THEN
            PERFORM replaysafe._raise('RS001', format(
                'action %s already exists with a different operation or request', p_action_key));
        END IF;
        IF a.state IN ('succeeded', 'failed') THEN
            RETURN replaysafe._claim_record('replay', a);
        ELSIF a.state = 'unknown' THEN
            RETURN replaysafe._claim_record('unknown', a);
        ELSIF a.state = 'running' AND a.lease_expires_at > p_now AND a.has_waiters THEN
            RETURN replaysafe._claim_record('running', a);
        END IF;
    END IF;

    IF NOT replaysafe._tenant_ok(p_tenant_id) THEN
        PERFORM replaysafe._deny_tenant();
    END IF;
    IF NOT v_found THEN
        INSERT INTO replaysafe.actions AS x (
            tenant_id, action_key, thread_id, operation, request, state, attempt, on_expired,
            idempotency_key, worker_id, lease_expires_at, created_at, updated_at)
        VALUES (
            p_tenant_id, p_action_key, p_thread_id, p_operation, p_request, 'running', 1,
            p_on_expired, replaysafe.idempotency_key(p_tenant_id, p_action_key), p_worker_id,
            p_now + p_lease, p_now, p_now)
        ON CONFLICT DO NOTHING
        -- Only what the answer needs (the rest is NULL): a whole row costs a copy.
        RETURNING x.state, x.attempt, x.lease_expires_at, x.idempotency_key
        INTO a.state, a.attempt, a.lease_expires_at, a.idempotency_key;
        IF FOUND THEN
            INSERT INTO replaysafe.action_attempts (tenant_id, action_key, attempt, worker_id, claimed_at)
            VALUES (p_tenant_id, p_action_key, 1, p_worker_id, p_now);
            RETURN replaysafe._claim_record('claimed', a);
        END IF;
        -- A concurrent claim created it first: decide under its row lock below.
    END IF;

    RETURN replaysafe._claim_locked(p_tenant_id, p_action_key, p_operation, p_request,
                                    p_worker_id, p_lease, p_thread_id, p_on_expired, p_now);
END
$$;

CREATE FUNCTION replaysafe.claim_actions(p_tenant_id text, p_action_keys text[], p_operations text[], p_requests jsonb[], p_worker_id text, p_lease interval DEFAULT '00:00:30'::interval, p_thread_id text DEFAULT NULL::text, p_on_expired text DEFAULT 'unknown'::text, p_now timestamp with time zone DEFAULT now()) RETURNS SETOF replaysafe.claim_record
    LANGUAGE plpgsql
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
    IF array_position(p_action_keys, NULL) IS NOT NULL THEN
        PERFORM replaysafe._invalid('p_action_keys', 'must not contain NULL');
    END IF;
    IF (SELECT count(DISTINCT k) FROM unnest(p_action_keys) k) <> n THEN
        PERFORM replaysafe._invalid('p_action_keys', 'must not repeat a key');
    END IF;
    FOR i IN SELECT o FROM unnest(p_action_keys) WITH ORDINALITY AS u(k, o) ORDER BY k LOOP
        results[i] := replaysafe.claim_action(p_tenant_id, p_action_keys[i], p_operations[i],
                                              p_requests[i], p_worker_id, p_lease, p_thread_id,
                                              p_on_expired, p_now);
    END LOOP;
    RETURN QUERY SELECT * FROM unnest(results);
END
$$;

CREATE FUNCTION replaysafe.complete_action(p_tenant_id text, p_action_key text, p_attempt integer, p_result jsonb, p_provider_reference text DEFAULT NULL::text, p_now timestamp with time zone DEFAULT now()) RETURNS text
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF p_result IS NULL THEN
        PERFORM replaysafe._invalid('p_result', 'must not be NULL (use the JSON value null)');
    END IF;
    RETURN replaysafe._report(p_tenant_id, p_action_key, p_attempt, 'succeeded', p_result, NULL,
                              p_provider_reference, p_now);
END
$$;

CREATE FUNCTION replaysafe.delete_thread(p_tenant_id text, p_thread_id text, p_user_id text DEFAULT NULL::text) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
DECLARE
    t replaysafe.threads;
BEGIN
    IF NOT (replaysafe._id_ok(p_tenant_id) AND replaysafe._id_ok(p_thread_id)
            AND (p_user_id IS NULL OR replaysafe._id_ok(p_user_id))) THEN
        PERFORM replaysafe._check_thread_args(p_tenant_id, p_thread_id, p_user_id);
    END IF;
    IF NOT replaysafe._tenant_ok(p_tenant_id) THEN
        PERFORM replaysafe._deny_tenant();
    END IF;

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
    SET version = t.version + 1, deleted = true, oldest_kept = t.version + 2, updated_at = now()
    WHERE x.tenant_id = p_tenant_id AND x.thread_id = p_thread_id;
    DELETE FROM replaysafe.thread_versions v
    WHERE v.tenant_id = p_tenant_id AND v.thread_id = p_thread_id
      AND v.version >= t.oldest_kept AND v.version <= t.version;
    RETURN true;
END
$$;

CREATE FUNCTION replaysafe.fail_action(p_tenant_id text, p_action_key text, p_attempt integer, p_error jsonb, p_retryable boolean DEFAULT false, p_now timestamp with time zone DEFAULT now()) RETURNS text
    LANGUAGE plpgsql
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

CREATE FUNCTION replaysafe.heartbeat_action(p_tenant_id text, p_action_key text, p_attempt integer, p_lease interval DEFAULT '00:00:30'::interval, p_now timestamp with time zone DEFAULT now()) RETURNS timestamp with time zone
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_expires timestamptz;
BEGIN
    IF NOT (replaysafe._id_ok(p_tenant_id) AND replaysafe._id_ok(p_action_key)) THEN
        PERFORM replaysafe._check_id('p_tenant_id', p_tenant_id);
        PERFORM replaysafe._check_id('p_action_key', p_action_key);
    END IF;
    IF p_attempt IS NULL OR p_attempt < 1 THEN
        PERFORM replaysafe._invalid('p_attempt', 'must be a positive attempt number');
    END IF;
    IF p_lease IS NULL OR p_lease <= interval '0' THEN
        PERFORM replaysafe._invalid('p_lease', 'must be a positive interval');
    END IF;
    IF p_now IS NULL THEN
        PERFORM replaysafe._invalid('p_now', 'must not be NULL');
    END IF;
    IF NOT replaysafe._tenant_ok(p_tenant_id) THEN
        PERFORM replaysafe._deny_tenant();
    END IF;

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

CREATE FUNCTION replaysafe.idempotency_key(p_tenant_id text, p_action_key text) RETURNS text
    LANGUAGE sql STABLE STRICT
    AS $$
    SELECT 'rs1_' || encode(sha256(convert_to(
        length(p_tenant_id)::text || ':' || p_tenant_id || p_action_key, 'UTF8')), 'hex')
$$;

CREATE FUNCTION replaysafe.mark_action_unknown(p_tenant_id text, p_action_key text, p_attempt integer, p_error jsonb, p_now timestamp with time zone DEFAULT now()) RETURNS text
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF p_error IS NULL THEN
        PERFORM replaysafe._invalid('p_error', 'must not be NULL');
    END IF;
    RETURN replaysafe._report(p_tenant_id, p_action_key, p_attempt, 'unknown', NULL, p_error,
                              NULL, p_now);
END
$$;

CREATE FUNCTION replaysafe.purge_actions(p_older_than interval, p_limit integer DEFAULT 10000, p_now timestamp with time zone DEFAULT now()) RETURNS integer
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_count integer;
BEGIN
    IF p_older_than IS NULL OR p_older_than < interval '0' THEN
        PERFORM replaysafe._invalid('p_older_than', 'must be a non-negative interval');
    END IF;
    IF p_limit IS NULL OR p_limit < 1 THEN
        PERFORM replaysafe._invalid('p_limit', 'must be a positive integer');
    END IF;
    IF p_now IS NULL THEN
        PERFORM replaysafe._invalid('p_now', 'must not be NULL');
    END IF;

    WITH victims AS (
        SELECT x.tenant_id, x.action_key
        FROM replaysafe.actions x
        WHERE x.state IN ('succeeded', 'failed') AND x.completed_at < p_now - p_older_than
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

CREATE FUNCTION replaysafe.read_thread(p_tenant_id text, p_thread_id text, p_user_id text DEFAULT NULL::text) RETURNS SETOF replaysafe.thread_record
    LANGUAGE sql STABLE
    AS $$
    SELECT coalesce(t.version, 0),
           -- A subquery, so the state is always one primary-key probe (a join may instead
           -- scan the thread's kept versions).
           (SELECT v.state FROM replaysafe.thread_versions v
            WHERE v.tenant_id = t.tenant_id AND v.thread_id = t.thread_id AND v.version = t.version),
           t.updated_at
    FROM (VALUES (1)) AS one (x)
    LEFT JOIN replaysafe.threads t
           ON t.tenant_id = p_tenant_id AND t.thread_id = p_thread_id
    WHERE CASE
        WHEN NOT (replaysafe._id_ok(p_tenant_id) AND replaysafe._id_ok(p_thread_id)
                  AND (p_user_id IS NULL OR replaysafe._id_ok(p_user_id)))
            THEN replaysafe._thread_args_fail(p_tenant_id, p_thread_id, p_user_id)
        WHEN t.thread_id IS NULL
            THEN replaysafe._tenant_or_deny(p_tenant_id)
        WHEN t.user_id IS NOT NULL AND t.user_id IS DISTINCT FROM p_user_id
            THEN replaysafe._thread_deny()
        ELSE true
    END
$$;

CREATE FUNCTION replaysafe.resolve_action(p_tenant_id text, p_action_key text, p_state text, p_result jsonb DEFAULT NULL::jsonb, p_error jsonb DEFAULT NULL::jsonb, p_provider_reference text DEFAULT NULL::text, p_note text DEFAULT NULL::text, p_now timestamp with time zone DEFAULT now()) RETURNS replaysafe.action_state
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_state replaysafe.action_state;
    v_old   replaysafe.action_state;
BEGIN
    IF NOT (replaysafe._id_ok(p_tenant_id) AND replaysafe._id_ok(p_action_key)) THEN
        PERFORM replaysafe._check_id('p_tenant_id', p_tenant_id);
        PERFORM replaysafe._check_id('p_action_key', p_action_key);
    END IF;
    IF p_state IS NULL OR p_state NOT IN ('succeeded', 'failed', 'retryable') THEN
        PERFORM replaysafe._invalid('p_state', 'must be ''succeeded'', ''failed'' or ''retryable''');
    END IF;
    IF p_now IS NULL THEN
        PERFORM replaysafe._invalid('p_now', 'must not be NULL');
    END IF;
    IF NOT replaysafe._tenant_ok(p_tenant_id) THEN
        PERFORM replaysafe._deny_tenant();
    END IF;
    v_state := p_state::replaysafe.action_state;

    SELECT x.state INTO v_old FROM replaysafe.actions x
    WHERE x.tenant_id = p_tenant_id AND x.action_key = p_action_key
    FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM replaysafe._raise('RS006', format('action %s does not exist', p_action_key));
    END IF;
    IF v_old <> 'unknown' THEN
        PERFORM replaysafe._raise('RS006', format(
            'action %s is %s; only unknown actions can be resolved', p_action_key, v_old));
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

CREATE FUNCTION replaysafe.sweep_expired_actions(p_limit integer DEFAULT 1000, p_now timestamp with time zone DEFAULT now()) RETURNS integer
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_count integer;
    v_keys  text[];
BEGIN
    IF p_limit IS NULL OR p_limit < 1 THEN
        PERFORM replaysafe._invalid('p_limit', 'must be a positive integer');
    END IF;
    IF p_now IS NULL THEN
        PERFORM replaysafe._invalid('p_now', 'must not be NULL');
    END IF;

    WITH due AS (
        SELECT x.tenant_id, x.action_key, x.attempt, x.on_expired, x.has_waiters,
               x.idempotency_key, x.lease_expires_at
        FROM replaysafe.actions x
        WHERE x.state = 'running' AND x.lease_expires_at <= p_now
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

    PERFORM pg_notify('replaysafe_actions', k) FROM unnest(v_keys) AS k;
    RETURN coalesce(v_count, 0);
END
$$;

CREATE FUNCTION replaysafe.thread_history(p_tenant_id text, p_thread_id text, p_user_id text DEFAULT NULL::text, p_limit integer DEFAULT 100) RETURNS TABLE(version bigint, state jsonb, created_at timestamp with time zone)
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_owner text;
BEGIN
    IF NOT (replaysafe._id_ok(p_tenant_id) AND replaysafe._id_ok(p_thread_id)
            AND (p_user_id IS NULL OR replaysafe._id_ok(p_user_id))) THEN
        PERFORM replaysafe._check_thread_args(p_tenant_id, p_thread_id, p_user_id);
    END IF;
    IF p_limit IS NULL OR p_limit < 1 THEN
        PERFORM replaysafe._invalid('p_limit', 'must be a positive integer');
    END IF;

    -- As in read_thread: the tenant check only when row-level security shows nothing.
    SELECT t.user_id INTO v_owner FROM replaysafe.threads t
    WHERE t.tenant_id = p_tenant_id AND t.thread_id = p_thread_id;
    IF NOT FOUND THEN
        IF NOT replaysafe._tenant_ok(p_tenant_id) THEN
            PERFORM replaysafe._deny_tenant();
        END IF;
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

CREATE FUNCTION replaysafe.unbind_role(p_role text) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF p_role IS NULL THEN
        PERFORM replaysafe._invalid('p_role', 'must not be NULL');
    END IF;
    DELETE FROM replaysafe.role_bindings b WHERE b.role_name = p_role;
    RETURN FOUND;
END
$$;

CREATE FUNCTION replaysafe.write_thread(p_tenant_id text, p_thread_id text, p_expected_version bigint, p_state jsonb, p_user_id text DEFAULT NULL::text, p_history_limit integer DEFAULT NULL::integer) RETURNS bigint
    LANGUAGE plpgsql
    AS $$
DECLARE
    t         replaysafe.threads;
    v_version bigint;
    v_limit   integer;
    v_oldest  bigint;
BEGIN
    IF NOT (replaysafe._id_ok(p_tenant_id) AND replaysafe._id_ok(p_thread_id)
            AND (p_user_id IS NULL OR replaysafe._id_ok(p_user_id))) THEN
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
    IF NOT replaysafe._tenant_ok(p_tenant_id) THEN
        PERFORM replaysafe._deny_tenant();
    END IF;

    IF p_expected_version = 0 THEN
        INSERT INTO replaysafe.threads AS x (
            tenant_id, thread_id, user_id, version, history_limit, oldest_kept, created_at,
            updated_at)
        VALUES (p_tenant_id, p_thread_id, p_user_id, 1, coalesce(p_history_limit, 20), 1,
                now(), now())
        ON CONFLICT DO NOTHING;
        IF FOUND THEN
            INSERT INTO replaysafe.thread_versions (tenant_id, thread_id, version, state, created_at)
            VALUES (p_tenant_id, p_thread_id, 1, p_state, now());
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
        updated_at = now()
    WHERE x.tenant_id = p_tenant_id AND x.thread_id = p_thread_id
      AND x.version = p_expected_version;
    IF NOT FOUND THEN
        -- Lost the race between our read and our update.
        SELECT x.version INTO v_version FROM replaysafe.threads x
        WHERE x.tenant_id = p_tenant_id AND x.thread_id = p_thread_id;
        PERFORM replaysafe._stale_thread(p_thread_id, p_expected_version, v_version);
    END IF;

    INSERT INTO replaysafe.thread_versions (tenant_id, thread_id, version, state, created_at)
    VALUES (p_tenant_id, p_thread_id, v_version, p_state, now());
    IF v_oldest > t.oldest_kept THEN
        DELETE FROM replaysafe.thread_versions v
        WHERE v.tenant_id = p_tenant_id AND v.thread_id = p_thread_id
          AND v.version >= t.oldest_kept AND v.version < v_oldest;
    END IF;
    RETURN v_version;
END
$$;

CREATE VIEW replaysafe.action_attempts_v WITH (security_invoker='true') AS
 SELECT tenant_id,
    action_key,
    attempt,
    worker_id,
    claimed_at,
    ended_at,
    outcome,
    superseded,
    error,
    result,
    provider_reference
   FROM replaysafe.action_attempts;

CREATE VIEW replaysafe.actions_v WITH (security_invoker='true') AS
 SELECT tenant_id,
    action_key,
    thread_id,
    operation,
    state,
    attempt,
    on_expired,
    idempotency_key,
    request,
    result,
    error,
    provider_reference,
    lease_expires_at,
    created_at,
    updated_at,
    completed_at,
    worker_id,
    resolution_note,
    resolved_at
   FROM replaysafe.actions;

CREATE VIEW replaysafe.multi_effect_actions WITH (security_invoker='true') AS
 SELECT t.tenant_id,
    t.action_key,
    a.operation,
    count(*) AS successful_attempts
   FROM (replaysafe.action_attempts t
     JOIN replaysafe.actions a ON (((a.tenant_id = t.tenant_id) AND (a.action_key = t.action_key))))
  WHERE (t.outcome = 'succeeded'::replaysafe.action_state)
  GROUP BY t.tenant_id, t.action_key, a.operation
 HAVING (count(*) > 1);

CREATE VIEW replaysafe.threads_v WITH (security_invoker='true') AS
 SELECT t.tenant_id,
    t.thread_id,
    t.user_id,
    t.version,
    t.deleted,
    v.state,
    t.history_limit,
    t.created_at,
    t.updated_at
   FROM (replaysafe.threads t
     LEFT JOIN replaysafe.thread_versions v ON (((v.tenant_id = t.tenant_id) AND (v.thread_id = t.thread_id) AND (v.version = t.version))));

CREATE VIEW replaysafe.unresolved_actions WITH (security_invoker='true') AS
 SELECT tenant_id,
    action_key,
    operation,
    state,
    lease_expires_at,
    (now() -
        CASE
            WHEN (state = 'running'::replaysafe.action_state) THEN lease_expires_at
            ELSE updated_at
        END) AS age,
    thread_id,
    created_at,
    updated_at
   FROM replaysafe.actions
  WHERE ((state = 'unknown'::replaysafe.action_state) OR ((state = 'running'::replaysafe.action_state) AND (lease_expires_at <= now())));

CREATE POLICY own_binding ON replaysafe.role_bindings FOR SELECT USING ((role_name = (CURRENT_USER)::text));

CREATE POLICY tenant_delete ON replaysafe.action_attempts FOR DELETE USING ((tenant_id = ( SELECT replaysafe._bound_tenant() AS _bound_tenant)));

CREATE POLICY tenant_delete ON replaysafe.actions FOR DELETE USING ((tenant_id = ( SELECT replaysafe._bound_tenant() AS _bound_tenant)));

CREATE POLICY tenant_delete ON replaysafe.thread_versions FOR DELETE USING ((tenant_id = ( SELECT replaysafe._bound_tenant() AS _bound_tenant)));

CREATE POLICY tenant_delete ON replaysafe.threads FOR DELETE USING ((tenant_id = ( SELECT replaysafe._bound_tenant() AS _bound_tenant)));

CREATE POLICY tenant_insert ON replaysafe.action_attempts FOR INSERT WITH CHECK ((tenant_id = ( SELECT replaysafe._bound_tenant() AS _bound_tenant)));

CREATE POLICY tenant_insert ON replaysafe.actions FOR INSERT WITH CHECK ((tenant_id = ( SELECT replaysafe._bound_tenant() AS _bound_tenant)));

CREATE POLICY tenant_insert ON replaysafe.thread_versions FOR INSERT WITH CHECK ((tenant_id = ( SELECT replaysafe._bound_tenant() AS _bound_tenant)));

CREATE POLICY tenant_insert ON replaysafe.threads FOR INSERT WITH CHECK ((tenant_id = ( SELECT replaysafe._bound_tenant() AS _bound_tenant)));

CREATE POLICY tenant_read ON replaysafe.action_attempts FOR SELECT USING (((tenant_id = ( SELECT replaysafe._bound_tenant() AS _bound_tenant)) OR ( SELECT replaysafe._reads_all_tenants() AS _reads_all_tenants)));

CREATE POLICY tenant_read ON replaysafe.actions FOR SELECT USING (((tenant_id = ( SELECT replaysafe._bound_tenant() AS _bound_tenant)) OR ( SELECT replaysafe._reads_all_tenants() AS _reads_all_tenants)));

CREATE POLICY tenant_read ON replaysafe.thread_versions FOR SELECT USING (((tenant_id = ( SELECT replaysafe._bound_tenant() AS _bound_tenant)) OR ( SELECT replaysafe._reads_all_tenants() AS _reads_all_tenants)));

CREATE POLICY tenant_read ON replaysafe.threads FOR SELECT USING (((tenant_id = ( SELECT replaysafe._bound_tenant() AS _bound_tenant)) OR ( SELECT replaysafe._reads_all_tenants() AS _reads_all_tenants)));

CREATE POLICY tenant_update ON replaysafe.action_attempts FOR UPDATE USING ((tenant_id = ( SELECT replaysafe._bound_tenant() AS _bound_tenant))) WITH CHECK ((tenant_id = ( SELECT replaysafe._bound_tenant() AS _bound_tenant)));

CREATE POLICY tenant_update ON replaysafe.actions FOR UPDATE USING ((tenant_id = ( SELECT replaysafe._bound_tenant() AS _bound_tenant))) WITH CHECK ((tenant_id = ( SELECT replaysafe._bound_tenant() AS _bound_tenant)));

CREATE POLICY tenant_update ON replaysafe.thread_versions FOR UPDATE USING ((tenant_id = ( SELECT replaysafe._bound_tenant() AS _bound_tenant))) WITH CHECK ((tenant_id = ( SELECT replaysafe._bound_tenant() AS _bound_tenant)));

CREATE POLICY tenant_update ON replaysafe.threads FOR UPDATE USING ((tenant_id = ( SELECT replaysafe._bound_tenant() AS _bound_tenant))) WITH CHECK ((tenant_id = ( SELECT replaysafe._bound_tenant() AS _bound_tenant)));

REVOKE ALL ON FUNCTION replaysafe._bound_tenant() FROM PUBLIC;

REVOKE ALL ON FUNCTION replaysafe._check_id(p_name text, p_value text, p_nullable boolean) FROM PUBLIC;

REVOKE ALL ON FUNCTION replaysafe._check_thread_args(p_tenant_id text, p_thread_id text, p_user_id text) FROM PUBLIC;

REVOKE ALL ON FUNCTION replaysafe._claim_locked(p_tenant_id text, p_action_key text, p_operation text, p_request jsonb, p_worker_id text, p_lease interval, p_thread_id text, p_on_expired text, p_now timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION replaysafe._claim_record(p_outcome text, a replaysafe.actions) FROM PUBLIC;

REVOKE ALL ON FUNCTION replaysafe._deny_tenant() FROM PUBLIC;

REVOKE ALL ON FUNCTION replaysafe._deny_thread() FROM PUBLIC;

REVOKE ALL ON FUNCTION replaysafe._expire_attempt(a replaysafe.actions, p_now timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION replaysafe._id_ok(p_value text) FROM PUBLIC;

REVOKE ALL ON FUNCTION replaysafe._invalid(p_name text, p_rule text) FROM PUBLIC;

REVOKE ALL ON FUNCTION replaysafe._raise(p_sqlstate text, p_message text, p_detail text) FROM PUBLIC;

REVOKE ALL ON FUNCTION replaysafe._reads_all_tenants() FROM PUBLIC;

REVOKE ALL ON FUNCTION replaysafe._report(p_tenant_id text, p_action_key text, p_attempt integer, p_state replaysafe.action_state, p_result jsonb, p_error jsonb, p_provider_reference text, p_now timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION replaysafe._stale_thread(p_thread_id text, p_expected bigint, p_current bigint) FROM PUBLIC;

REVOKE ALL ON FUNCTION replaysafe._tenant_ok(p_tenant_id text) FROM PUBLIC;

REVOKE ALL ON FUNCTION replaysafe._tenant_or_deny(p_tenant_id text) FROM PUBLIC;

REVOKE ALL ON FUNCTION replaysafe._thread_args_fail(p_tenant_id text, p_thread_id text, p_user_id text) FROM PUBLIC;

REVOKE ALL ON FUNCTION replaysafe._thread_deny() FROM PUBLIC;

REVOKE ALL ON FUNCTION replaysafe.bind_role_to_tenant(p_role text, p_tenant_id text) FROM PUBLIC;

REVOKE ALL ON FUNCTION replaysafe.claim_action(p_tenant_id text, p_action_key text, p_operation text, p_request jsonb, p_worker_id text, p_lease interval, p_thread_id text, p_on_expired text, p_now timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION replaysafe.claim_actions(p_tenant_id text, p_action_keys text[], p_operations text[], p_requests jsonb[], p_worker_id text, p_lease interval, p_thread_id text, p_on_expired text, p_now timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION replaysafe.complete_action(p_tenant_id text, p_action_key text, p_attempt integer, p_result jsonb, p_provider_reference text, p_now timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION replaysafe.delete_thread(p_tenant_id text, p_thread_id text, p_user_id text) FROM PUBLIC;

REVOKE ALL ON FUNCTION replaysafe.fail_action(p_tenant_id text, p_action_key text, p_attempt integer, p_error jsonb, p_retryable boolean, p_now timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION replaysafe.heartbeat_action(p_tenant_id text, p_action_key text, p_attempt integer, p_lease interval, p_now timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION replaysafe.idempotency_key(p_tenant_id text, p_action_key text) FROM PUBLIC;

REVOKE ALL ON FUNCTION replaysafe.mark_action_unknown(p_tenant_id text, p_action_key text, p_attempt integer, p_error jsonb, p_now timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION replaysafe.purge_actions(p_older_than interval, p_limit integer, p_now timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION replaysafe.read_thread(p_tenant_id text, p_thread_id text, p_user_id text) FROM PUBLIC;

REVOKE ALL ON FUNCTION replaysafe.resolve_action(p_tenant_id text, p_action_key text, p_state text, p_result jsonb, p_error jsonb, p_provider_reference text, p_note text, p_now timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION replaysafe.sweep_expired_actions(p_limit integer, p_now timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION replaysafe.thread_history(p_tenant_id text, p_thread_id text, p_user_id text, p_limit integer) FROM PUBLIC;

REVOKE ALL ON FUNCTION replaysafe.unbind_role(p_role text) FROM PUBLIC;

REVOKE ALL ON FUNCTION replaysafe.write_thread(p_tenant_id text, p_thread_id text, p_expected_version bigint, p_state jsonb, p_user_id text, p_history_limit integer) FROM PUBLIC;

--
-- PostgreSQL database dump complete
--


-- Privileges of 0002, for the group roles that exist (they are created only where the
-- migrating role may create roles).
DO $grants$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'replaysafe_worker') THEN
        GRANT USAGE ON SCHEMA replaysafe TO replaysafe_worker;
        GRANT ALL ON FUNCTION replaysafe._bound_tenant() TO replaysafe_worker;
        GRANT ALL ON FUNCTION replaysafe._check_id(p_name text, p_value text, p_nullable boolean) TO replaysafe_worker;
        GRANT ALL ON FUNCTION replaysafe._check_thread_args(p_tenant_id text, p_thread_id text, p_user_id text) TO replaysafe_worker;
        GRANT ALL ON FUNCTION replaysafe._claim_locked(p_tenant_id text, p_action_key text, p_operation text, p_request jsonb, p_worker_id text, p_lease interval, p_thread_id text, p_on_expired text, p_now timestamp with time zone) TO replaysafe_worker;
        GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE replaysafe.actions TO replaysafe_worker;
        GRANT ALL ON FUNCTION replaysafe._claim_record(p_outcome text, a replaysafe.actions) TO replaysafe_worker;
        GRANT ALL ON FUNCTION replaysafe._deny_tenant() TO replaysafe_worker;
        GRANT ALL ON FUNCTION replaysafe._deny_thread() TO replaysafe_worker;
        GRANT ALL ON FUNCTION replaysafe._expire_attempt(a replaysafe.actions, p_now timestamp with time zone) TO replaysafe_worker;
        GRANT ALL ON FUNCTION replaysafe._id_ok(p_value text) TO replaysafe_worker;
        GRANT ALL ON FUNCTION replaysafe._invalid(p_name text, p_rule text) TO replaysafe_worker;
        GRANT ALL ON FUNCTION replaysafe._raise(p_sqlstate text, p_message text, p_detail text) TO replaysafe_worker;
        GRANT ALL ON FUNCTION replaysafe._reads_all_tenants() TO replaysafe_worker;
        GRANT ALL ON FUNCTION replaysafe._report(p_tenant_id text, p_action_key text, p_attempt integer, p_state replaysafe.action_state, p_result jsonb, p_error jsonb, p_provider_reference text, p_now timestamp with time zone) TO replaysafe_worker;
        GRANT ALL ON FUNCTION replaysafe._stale_thread(p_thread_id text, p_expected bigint, p_current bigint) TO replaysafe_worker;
        GRANT ALL ON FUNCTION replaysafe._tenant_ok(p_tenant_id text) TO replaysafe_worker;
        GRANT ALL ON FUNCTION replaysafe._tenant_or_deny(p_tenant_id text) TO replaysafe_worker;
        GRANT ALL ON FUNCTION replaysafe._thread_args_fail(p_tenant_id text, p_thread_id text, p_user_id text) TO replaysafe_worker;
        GRANT ALL ON FUNCTION replaysafe._thread_deny() TO replaysafe_worker;
        GRANT ALL ON FUNCTION replaysafe.bind_role_to_tenant(p_role text, p_tenant_id text) TO replaysafe_worker;
        GRANT ALL ON FUNCTION replaysafe.claim_action(p_tenant_id text, p_action_key text, p_operation text, p_request jsonb, p_worker_id text, p_lease interval, p_thread_id text, p_on_expired text, p_now timestamp with time zone) TO replaysafe_worker;
        GRANT ALL ON FUNCTION replaysafe.claim_actions(p_tenant_id text, p_action_keys text[], p_operations text[], p_requests jsonb[], p_worker_id text, p_lease interval, p_thread_id text, p_on_expired text, p_now timestamp with time zone) TO replaysafe_worker;
        GRANT ALL ON FUNCTION replaysafe.complete_action(p_tenant_id text, p_action_key text, p_attempt integer, p_result jsonb, p_provider_reference text, p_now timestamp with time zone) TO replaysafe_worker;
        GRANT ALL ON FUNCTION replaysafe.delete_thread(p_tenant_id text, p_thread_id text, p_user_id text) TO replaysafe_worker;
        GRANT ALL ON FUNCTION replaysafe.fail_action(p_tenant_id text, p_action_key text, p_attempt integer, p_error jsonb, p_retryable boolean, p_now timestamp with time zone) TO replaysafe_worker;
        GRANT ALL ON FUNCTION replaysafe.heartbeat_action(p_tenant_id text, p_action_key text, p_attempt integer, p_lease interval, p_now timestamp with time zone) TO replaysafe_worker;
        GRANT ALL ON FUNCTION replaysafe.idempotency_key(p_tenant_id text, p_action_key text) TO replaysafe_worker;
        GRANT ALL ON FUNCTION replaysafe.mark_action_unknown(p_tenant_id text, p_action_key text, p_attempt integer, p_error jsonb, p_now timestamp with time zone) TO replaysafe_worker;
        GRANT ALL ON FUNCTION replaysafe.purge_actions(p_older_than interval, p_limit integer, p_now timestamp with time zone) TO replaysafe_worker;
        GRANT ALL ON FUNCTION replaysafe.read_thread(p_tenant_id text, p_thread_id text, p_user_id text) TO replaysafe_worker;
        GRANT ALL ON FUNCTION replaysafe.resolve_action(p_tenant_id text, p_action_key text, p_state text, p_result jsonb, p_error jsonb, p_provider_reference text, p_note text, p_now timestamp with time zone) TO replaysafe_worker;
        GRANT ALL ON FUNCTION replaysafe.sweep_expired_actions(p_limit integer, p_now timestamp with time zone) TO replaysafe_worker;
        GRANT ALL ON FUNCTION replaysafe.thread_history(p_tenant_id text, p_thread_id text, p_user_id text, p_limit integer) TO replaysafe_worker;
        GRANT ALL ON FUNCTION replaysafe.unbind_role(p_role text) TO replaysafe_worker;
        GRANT ALL ON FUNCTION replaysafe.write_thread(p_tenant_id text, p_thread_id text, p_expected_version bigint, p_state jsonb, p_user_id text, p_history_limit integer) TO replaysafe_worker;
        GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE replaysafe.action_attempts TO replaysafe_worker;
        GRANT SELECT ON TABLE replaysafe.action_attempts_v TO replaysafe_worker;
        GRANT SELECT ON TABLE replaysafe.actions_v TO replaysafe_worker;
        GRANT SELECT ON TABLE replaysafe.multi_effect_actions TO replaysafe_worker;
        GRANT SELECT ON TABLE replaysafe.role_bindings TO replaysafe_worker;
        GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE replaysafe.thread_versions TO replaysafe_worker;
        GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE replaysafe.threads TO replaysafe_worker;
        GRANT SELECT ON TABLE replaysafe.threads_v TO replaysafe_worker;
        GRANT SELECT ON TABLE replaysafe.unresolved_actions TO replaysafe_worker;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'replaysafe_auditor') THEN
        GRANT USAGE ON SCHEMA replaysafe TO replaysafe_auditor;
        GRANT ALL ON FUNCTION replaysafe._bound_tenant() TO replaysafe_auditor;
        GRANT SELECT ON TABLE replaysafe.actions TO replaysafe_auditor;
        GRANT ALL ON FUNCTION replaysafe._reads_all_tenants() TO replaysafe_auditor;
        GRANT ALL ON FUNCTION replaysafe.idempotency_key(p_tenant_id text, p_action_key text) TO replaysafe_auditor;
        GRANT SELECT ON TABLE replaysafe.action_attempts TO replaysafe_auditor;
        GRANT SELECT ON TABLE replaysafe.action_attempts_v TO replaysafe_auditor;
        GRANT SELECT ON TABLE replaysafe.actions_v TO replaysafe_auditor;
        GRANT SELECT ON TABLE replaysafe.multi_effect_actions TO replaysafe_auditor;
        GRANT SELECT ON TABLE replaysafe.role_bindings TO replaysafe_auditor;
        GRANT SELECT ON TABLE replaysafe.thread_versions TO replaysafe_auditor;
        GRANT SELECT ON TABLE replaysafe.threads TO replaysafe_auditor;
        GRANT SELECT ON TABLE replaysafe.threads_v TO replaysafe_auditor;
        GRANT SELECT ON TABLE replaysafe.unresolved_actions TO replaysafe_auditor;
    END IF;
END
$grants$;

-- The operator role is cluster-wide: drop it only where no other database still uses it.
DO $roles$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'replaysafe_operator') THEN
        BEGIN
            DROP ROLE replaysafe_operator;
        EXCEPTION WHEN dependent_objects_still_exist OR insufficient_privilege THEN
            RAISE NOTICE 'role replaysafe_operator kept: still used elsewhere';
        END;
    END IF;
END
$roles$;

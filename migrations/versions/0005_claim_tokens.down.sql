-- Downgrade of 0005: the claim functions of 0004, and the actions without their token.
SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);

DROP FUNCTION replaysafe.claim_action(text, text, text, jsonb, text, interval, text, text, timestamptz, text), replaysafe._claim_locked(text, text, text, jsonb, text, interval, text, text, timestamptz, text), replaysafe.claim_actions(text, text[], text[], jsonb[], text, interval, text, text, timestamptz, text[]);
DROP VIEW replaysafe.actions_v, replaysafe.unresolved_actions, replaysafe._visible_actions;
ALTER TABLE replaysafe.actions DROP COLUMN claim_token;

CREATE VIEW replaysafe._visible_actions WITH (security_barrier = true) AS
SELECT x.* FROM replaysafe.actions x
WHERE x.tenant_id = (SELECT r.tenant_id FROM replaysafe._reader r)
UNION ALL
SELECT x.* FROM replaysafe.actions x
WHERE (SELECT r.reads_all FROM replaysafe._reader r);

CREATE VIEW replaysafe.actions_v WITH (security_barrier = true) AS
SELECT x.tenant_id, x.action_key, x.thread_id, x.operation, x.state, x.attempt, x.on_expired,
       x.idempotency_key, x.request, x.result, x.error, x.provider_reference, x.lease_expires_at,
       x.created_at, x.updated_at, x.completed_at, x.worker_id, x.resolution_note, x.resolved_at
FROM replaysafe._visible_actions x;

CREATE VIEW replaysafe.unresolved_actions WITH (security_barrier = true) AS
SELECT x.tenant_id, x.action_key, x.operation, x.state, x.lease_expires_at,
       now() - CASE WHEN x.state = 'running' THEN x.lease_expires_at ELSE x.updated_at END AS age,
       x.thread_id, x.created_at, x.updated_at
FROM replaysafe._visible_actions x
WHERE x.state = 'unknown' OR (x.state = 'running' AND x.lease_expires_at <= now());

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

-- Every privilege but the owner's goes (PUBLIC's default EXECUTE and whatever ALTER DEFAULT
-- PRIVILEGES added), then the grants of schema.sql.
DO $grants$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT DISTINCT p.oid::pg_catalog.regprocedure::text AS f, a.grantee
             FROM pg_catalog.pg_proc p,
                  pg_catalog.aclexplode(coalesce(p.proacl, pg_catalog.acldefault('f', p.proowner))) a
             WHERE p.oid IN ('replaysafe.claim_action(text, text, text, jsonb, text, interval, text, text, timestamptz)'::pg_catalog.regprocedure,
                 'replaysafe._claim_locked(text, text, text, jsonb, text, interval, text, text, timestamptz)'::pg_catalog.regprocedure,
                 'replaysafe.claim_actions(text, text[], text[], jsonb[], text, interval, text, text, timestamptz)'::pg_catalog.regprocedure)
               AND a.grantee <> p.proowner LOOP
        EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM %s', r.f,
            CASE WHEN r.grantee = 0 THEN 'PUBLIC' ELSE r.grantee::pg_catalog.regrole::text END);
    END LOOP;
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'replaysafe_worker') THEN
        GRANT EXECUTE ON FUNCTION
            replaysafe.claim_action(text, text, text, jsonb, text, interval, text, text, timestamptz),
            replaysafe.claim_actions(text, text[], text[], jsonb[], text, interval, text, text, timestamptz)
        TO replaysafe_worker;
    END IF;
    -- The views are new objects again: what default privileges gave them goes, then the
    -- grants of schema.sql.
    FOR r IN SELECT DISTINCT c.oid::pg_catalog.regclass::text AS v, a.grantee
             FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
             WHERE c.oid IN ('replaysafe._visible_actions'::pg_catalog.regclass,
                             'replaysafe.actions_v'::pg_catalog.regclass,
                             'replaysafe.unresolved_actions'::pg_catalog.regclass)
               AND a.grantee <> c.relowner LOOP
        EXECUTE pg_catalog.format('REVOKE ALL ON %s FROM %s', r.v,
            CASE WHEN r.grantee = 0 THEN 'PUBLIC' ELSE r.grantee::pg_catalog.regrole::text END);
    END LOOP;
    -- In schema.sql's order: an ACL keeps the order of its grants, and the dumps compare it.
    FOR r IN SELECT u.rolname FROM pg_catalog.unnest(ARRAY['replaysafe_worker',
                 'replaysafe_auditor', 'replaysafe_operator']) WITH ORDINALITY AS u(rolname, n)
             WHERE EXISTS (SELECT 1 FROM pg_catalog.pg_roles g WHERE g.rolname = u.rolname)
             ORDER BY u.n LOOP
        EXECUTE pg_catalog.format(
            'GRANT SELECT ON replaysafe.actions_v, replaysafe.unresolved_actions TO %I', r.rolname);
    END LOOP;
END
$grants$;

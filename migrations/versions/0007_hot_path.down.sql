-- Downgrade of 0007: every first attempt gets its row (0006 expects one per attempt), then
-- 0006's definitions. No action may change until they are in place: the table lock holds
-- back writers (a claim already waiting inside a 0007 function still runs it after the
-- commit: stop workers before downgrading; docs/migrations.md has the repair query).

SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);

LOCK TABLE replaysafe.actions IN EXCLUSIVE MODE;

INSERT INTO replaysafe.action_attempts (tenant_id, action_key, attempt, worker_id, claimed_at,
                                        ended_at, outcome, superseded, error, result,
                                        provider_reference)
SELECT f.tenant_id, f.action_key, f.attempt, f.worker_id, f.claimed_at, f.ended_at, f.outcome,
       f.superseded, f.error, f.result, f.provider_reference
FROM replaysafe._first_attempts f
ON CONFLICT DO NOTHING;

CREATE OR REPLACE VIEW replaysafe.action_attempts_v WITH (security_barrier = true) AS
SELECT t.tenant_id, t.action_key, t.attempt, t.worker_id, t.claimed_at, t.ended_at, t.outcome,
       t.superseded, t.error, t.result, t.provider_reference
FROM replaysafe._visible_attempts t;

DROP VIEW replaysafe._visible_first_attempts;

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
    p_claim_token text        DEFAULT NULL)
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
             OR (octet_length(p_thread_id) BETWEEN 1 AND 1024 AND length(p_thread_id) <= 512))
        AND (p_claim_token IS NULL
             OR (octet_length(p_claim_token) BETWEEN 1 AND 1024 AND length(p_claim_token) <= 512)))
       IS NOT TRUE THEN
        PERFORM replaysafe._check_id('p_tenant_id', p_tenant_id);
        PERFORM replaysafe._check_id('p_action_key', p_action_key);
        PERFORM replaysafe._check_id('p_operation', p_operation);
        PERFORM replaysafe._check_id('p_worker_id', p_worker_id);
        PERFORM replaysafe._check_id('p_thread_id', p_thread_id, true);
        PERFORM replaysafe._check_id('p_claim_token', p_claim_token, true);
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
        ELSIF a.state = 'running' AND a.claim_token = p_claim_token
              AND a.lease_expires_at > greatest(p_now, clock_timestamp()) THEN
            -- Our own claim, whose answer was lost: no lock needed, only the token's holder
            -- (who does not know it holds the lease) could move the action on.
            RETURN ('claimed', a.state, a.attempt, a.lease_expires_at, a.result, a.error,
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
            idempotency_key, worker_id, lease_expires_at, created_at, updated_at, claim_token)
        VALUES (
            p_tenant_id, p_action_key, p_thread_id, p_operation, p_request, 'running', 1,
            p_on_expired, a.idempotency_key, p_worker_id,
            p_now + p_lease, p_now, p_now, p_claim_token)
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
                                    p_worker_id, p_lease, p_thread_id, p_on_expired, p_now,
                                    p_claim_token);
END
$$;

CREATE OR REPLACE FUNCTION replaysafe._claim_locked(
    p_tenant_id text, p_action_key text, p_operation text, p_request jsonb,
    p_worker_id text, p_lease interval, p_thread_id text, p_on_expired text, p_now timestamptz,
    p_claim_token text)
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
                                       p_worker_id, p_lease, p_thread_id, p_on_expired, p_now,
                                       p_claim_token);
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
    ELSIF a.state = 'running' AND a.claim_token = p_claim_token
              AND a.lease_expires_at > greatest(p_now, clock_timestamp()) THEN
        RETURN ('claimed', a.state, a.attempt, a.lease_expires_at, a.result, a.error,
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
        provider_reference = NULL, updated_at = p_now, claim_token = p_claim_token
    WHERE x.tenant_id = p_tenant_id AND x.action_key = p_action_key
    RETURNING * INTO a;
    INSERT INTO replaysafe.action_attempts (tenant_id, action_key, attempt, worker_id, claimed_at)
    VALUES (p_tenant_id, p_action_key, a.attempt, p_worker_id, p_now);
    RETURN ('claimed', a.state, a.attempt, a.lease_expires_at, a.result, a.error,
                a.idempotency_key, a.provider_reference)::replaysafe.claim_record;
END
$$;

CREATE OR REPLACE FUNCTION replaysafe._expire_attempt(a replaysafe.actions, p_now timestamptz)
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

CREATE OR REPLACE FUNCTION replaysafe._report(
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

CREATE OR REPLACE FUNCTION replaysafe.sweep_expired_actions(
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
    v_tenants text[];
    v_actions text[];
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

    -- The batch first, locked: through (tenant_id, lease_expires_at) for a tenant's sweep, so it
    -- never walks other tenants' expired leases; through (lease_expires_at) for everyone's.
    IF v_tenant IS NULL THEN
        SELECT array_agg(d.tenant_id), array_agg(d.action_key) INTO v_tenants, v_actions
        FROM (SELECT x.tenant_id, x.action_key FROM replaysafe.actions x
              WHERE x.state = 'running' AND x.lease_expires_at <= p_now
              ORDER BY x.lease_expires_at LIMIT p_limit FOR UPDATE SKIP LOCKED) d;
    ELSE
        SELECT array_agg(d.tenant_id), array_agg(d.action_key) INTO v_tenants, v_actions
        FROM (SELECT x.tenant_id, x.action_key FROM replaysafe.actions x
              WHERE x.tenant_id = v_tenant AND x.state = 'running' AND x.lease_expires_at <= p_now
              ORDER BY x.lease_expires_at LIMIT p_limit FOR UPDATE SKIP LOCKED) d;
    END IF;
    IF v_actions IS NULL THEN
        RETURN 0;
    END IF;

    WITH due AS (
        SELECT x.tenant_id, x.action_key, x.attempt, x.on_expired, x.has_waiters,
               x.idempotency_key, x.lease_expires_at
        FROM unnest(v_tenants, v_actions) AS k(tenant_id, action_key)
        JOIN replaysafe.actions x ON x.tenant_id = k.tenant_id AND x.action_key = k.action_key
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

CREATE OR REPLACE FUNCTION replaysafe.resolve_action(
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

CREATE OR REPLACE FUNCTION replaysafe.reopen_action(
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

DROP FUNCTION replaysafe._keep_first_attempt(text, text);

DROP VIEW replaysafe._first_attempts;

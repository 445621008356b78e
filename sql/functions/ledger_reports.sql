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

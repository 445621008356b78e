-- The action ledger: what the attempt that holds a lease reports (heartbeats, complete, fail,
-- mark unknown).

CREATE OR REPLACE FUNCTION replaysafe.heartbeat_action(
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
    -- The tenant check's common case inline: a caller bound to p_tenant_id, per _caller
    -- (which holds the security-restricted-operation probe). Anything else, and any argument
    -- with a COLLATE clause, takes _acts_for's whole path (its answer or its error). Both
    -- tests compare under "C" (see _acts_for).
    IF pg_collation_for(p_tenant_id) COLLATE "C" IS DISTINCT FROM '"default"'
       OR ((SELECT c.tenant_id FROM replaysafe._caller c) = p_tenant_id COLLATE "C") IS NOT TRUE THEN
        PERFORM replaysafe._acts_for(p_tenant_id);
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

-- The one implementation of an attempt's report (complete, fail, mark unknown).
-- recorded: the action was running under this attempt. late: it is still on this attempt
-- but left running without a final report (expiry, or the attempt said unknown).
-- superseded: a newer attempt or a final outcome exists; kept on the attempt row only.
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
    -- The tenant check's common case inline: a caller bound to p_tenant_id, per _caller
    -- (which holds the security-restricted-operation probe). Anything else, and any argument
    -- with a COLLATE clause, takes _acts_for's whole path (its answer or its error). Both
    -- tests compare under "C" (see _acts_for).
    IF pg_collation_for(p_tenant_id) COLLATE "C" IS DISTINCT FROM '"default"'
       OR ((SELECT c.tenant_id FROM replaysafe._caller c) = p_tenant_id COLLATE "C") IS NOT TRUE THEN
        PERFORM replaysafe._acts_for(p_tenant_id);
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
        IF a.attempt = 1 THEN  -- the report below is not the action's: its row keeps what was
            PERFORM replaysafe._keep_first_attempt(p_tenant_id, p_action_key);
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

CREATE OR REPLACE FUNCTION replaysafe.complete_action(
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

CREATE OR REPLACE FUNCTION replaysafe.fail_action(
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

CREATE OR REPLACE FUNCTION replaysafe.mark_action_unknown(
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

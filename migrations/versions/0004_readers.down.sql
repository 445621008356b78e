-- Downgrade of 0004.
SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
DROP FUNCTION replaysafe.installed_revision();
CREATE OR REPLACE VIEW replaysafe.multi_effect_actions WITH (security_barrier = true) AS
SELECT t.tenant_id, t.action_key, a.operation, count(*) AS successful_attempts
FROM replaysafe._visible_attempts t
JOIN replaysafe.actions a ON a.tenant_id = t.tenant_id AND a.action_key = t.action_key
WHERE t.outcome = 'succeeded'
GROUP BY t.tenant_id, t.action_key, a.operation
HAVING count(*) > 1;
DROP INDEX replaysafe.actions_tenant_running_lease_idx;
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
DROP INDEX replaysafe.actions_tenant_terminal_completed_idx;
DROP INDEX replaysafe.actions_unknown_idx;
CREATE INDEX actions_unknown_idx ON replaysafe.actions (updated_at)
    WHERE state = 'unknown';
CREATE OR REPLACE FUNCTION replaysafe.purge_actions(
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
CREATE OR REPLACE FUNCTION replaysafe._acts_for(p_tenant_id text)
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
CREATE OR REPLACE VIEW replaysafe._reader AS
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


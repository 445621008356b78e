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

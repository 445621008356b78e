-- Revision 0008: the tenant check. Its COLLATE guard compares under "C": an attacker's
-- nondeterministic collation could make its own name equal '"default"' and the tenant ids
-- equal (a security review of this revision; 0007 and earlier are affected). Its common
-- case (a caller bound to the tenant it acts for) runs inline in the hot functions instead
-- of a call of replaysafe._acts_for, and the security-restricted-operation probe is a
-- static DEALLOCATE (prepared once a session) instead of a dynamic EXECUTE. Interfaces,
-- tables and grants unchanged (issue 12, docs/performance.md#the-tenant-check-revision-0008).

SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);

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

CREATE OR REPLACE FUNCTION replaysafe._acts_for(p_tenant_id text)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_tenant text;
    v_role   text;
BEGIN
    -- Every collatable argument of a PL/pgSQL call shares the collation of the call's
    -- arguments, and it wins over the columns' in every comparison in the function: a
    -- caller's nondeterministic collation (a case-insensitive one in pg_temp, say) on any
    -- argument made 'acme' equal 'ACME' here and in every key lookup after it. The name
    -- pg_collation_for gives is text in that collation too: compared under its own, an
    -- attacker's collation named _."default" (punctuation ignored) equalled '"default"'
    -- (revision 0008's review): both comparisons here are under "C".
    IF pg_collation_for(p_tenant_id) COLLATE "C" IS DISTINCT FROM '"default"' THEN
        PERFORM replaysafe._invalid('p_tenant_id', 'the arguments must not carry a COLLATE clause '
                                    '(comparisons use the database''s collation)');
    END IF;
    SELECT c.tenant_id, c.role_name INTO v_tenant, v_role FROM replaysafe._caller c;
    IF v_tenant = p_tenant_id COLLATE "C" THEN
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
    -- The tenant check's common case inline: a caller bound to p_tenant_id, per _caller
    -- (which holds the security-restricted-operation probe). Anything else, and any argument
    -- with a COLLATE clause, takes _acts_for's whole path (its answer or its error). Both
    -- tests compare under "C" (see _acts_for).
    IF pg_collation_for(p_tenant_id) COLLATE "C" IS DISTINCT FROM '"default"'
       OR ((SELECT c.tenant_id FROM replaysafe._caller c) = p_tenant_id COLLATE "C") IS NOT TRUE THEN
        PERFORM replaysafe._acts_for(p_tenant_id);
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
            -- No attempt row: the action row is the record of its first attempt until
            -- something else than that attempt's own report changes it (_keep_first_attempt).
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

CREATE OR REPLACE FUNCTION replaysafe.read_thread(
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
    -- The tenant check's common case inline: a caller bound to p_tenant_id, per _caller
    -- (which holds the security-restricted-operation probe). Anything else, and any argument
    -- with a COLLATE clause, takes _acts_for's whole path (its answer or its error). Both
    -- tests compare under "C" (see _acts_for).
    IF pg_collation_for(p_tenant_id) COLLATE "C" IS DISTINCT FROM '"default"'
       OR ((SELECT c.tenant_id FROM replaysafe._caller c) = p_tenant_id COLLATE "C") IS NOT TRUE THEN
        PERFORM replaysafe._acts_for(p_tenant_id);
    END IF;

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

CREATE OR REPLACE FUNCTION replaysafe.write_thread(
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
    -- The tenant check's common case inline: a caller bound to p_tenant_id, per _caller
    -- (which holds the security-restricted-operation probe). Anything else, and any argument
    -- with a COLLATE clause, takes _acts_for's whole path (its answer or its error). Both
    -- tests compare under "C" (see _acts_for).
    IF pg_collation_for(p_tenant_id) COLLATE "C" IS DISTINCT FROM '"default"'
       OR ((SELECT c.tenant_id FROM replaysafe._caller c) = p_tenant_id COLLATE "C") IS NOT TRUE THEN
        PERFORM replaysafe._acts_for(p_tenant_id);
    END IF;

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
    p_history_limit integer DEFAULT NULL)
RETURNS replaysafe.langgraph_put_record
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_refused text[];
    v_head    text;
    v_found   boolean;
    v_old     record;
    r         replaysafe.langgraph_put_record;
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
    IF p_channels IS NULL OR p_versions IS NULL OR p_types IS NULL OR p_blobs IS NULL
       OR cardinality(p_versions) <> cardinality(p_channels)
       OR cardinality(p_types) <> cardinality(p_channels)
       OR cardinality(p_blobs) <> cardinality(p_channels) THEN
        PERFORM replaysafe._invalid('p_channels',
            'p_channels, p_versions, p_types and p_blobs must be arrays of one length');
    END IF;
    -- Channels and versions are bounded like ids (they are keys of langgraph_blobs); a blob
    -- is NULL only for a channel emptied at this version.
    IF cardinality(p_channels) > 0 AND EXISTS (
           SELECT 1 FROM unnest(p_channels, p_versions, p_types) AS v(channel, version, type)
           WHERE (octet_length(v.channel) BETWEEN 1 AND 1024 AND length(v.channel) <= 512
                  AND octet_length(v.version) BETWEEN 1 AND 1024 AND length(v.version) <= 512
                  AND octet_length(v.type) BETWEEN 1 AND 1024) IS NOT TRUE) THEN
        PERFORM replaysafe._invalid('p_channels',
            'every channel, version and type must be non-empty text of at most 512 characters '
            'and 1024 bytes');
    END IF;
    IF p_history_limit < 1 THEN
        PERFORM replaysafe._invalid('p_history_limit',
            'must be a positive number of checkpoints (got ' || p_history_limit || ')');
    END IF;
    -- The tenant check's common case inline: a caller bound to p_tenant_id, per _caller
    -- (which holds the security-restricted-operation probe). Anything else, and any argument
    -- with a COLLATE clause, takes _acts_for's whole path (its answer or its error). Both
    -- tests compare under "C" (see _acts_for).
    IF pg_collation_for(p_tenant_id) COLLATE "C" IS DISTINCT FROM '"default"'
       OR ((SELECT c.tenant_id FROM replaysafe._caller c) = p_tenant_id COLLATE "C") IS NOT TRUE THEN
        PERFORM replaysafe._acts_for(p_tenant_id);
    END IF;

    -- The namespace's lock (inline: the common case, a namespace already written to).
    SELECT n.refused, n.head INTO v_refused, v_head FROM replaysafe.langgraph_namespaces n
    WHERE n.tenant_id = p_tenant_id AND n.thread_id = p_thread_id
      AND n.checkpoint_ns = p_checkpoint_ns
    FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        v_refused := replaysafe._langgraph_namespace(p_tenant_id, p_thread_id, p_checkpoint_ns,
                                                     true);
        -- Locked now; another put may have created the row (and a head) meanwhile.
        SELECT n.head INTO v_head FROM replaysafe.langgraph_namespaces n
        WHERE n.tenant_id = p_tenant_id AND n.thread_id = p_thread_id
          AND n.checkpoint_ns = p_checkpoint_ns;
    END IF;

    -- A run continuing from the head (the common case) is accepted without further reads.
    IF p_metadata ->> 'source' IN ('input', 'loop') AND p_parent_id IS DISTINCT FROM v_head THEN
        v_head := replaysafe._langgraph_head(p_tenant_id, p_thread_id, p_checkpoint_ns, v_head);
        -- Saving the head again (same id) is no fork.
        IF v_head IS DISTINCT FROM p_checkpoint_id
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
            SET refused = (n.refused || p_checkpoint_id)[greatest(1, cardinality(n.refused) - 30):]
            WHERE n.tenant_id = p_tenant_id AND n.thread_id = p_thread_id
              AND n.checkpoint_ns = p_checkpoint_ns;
            r.stored := false;
            r.head_checkpoint_id := v_head;
            RETURN r;
        END IF;
    END IF;

    IF cardinality(p_channels) > 0 THEN
        INSERT INTO replaysafe.langgraph_blobs (tenant_id, thread_id, checkpoint_ns, channel,
                                                version, type, blob)
        SELECT p_tenant_id, p_thread_id, p_checkpoint_ns, v.channel, v.version, v.type, v.blob
        FROM unnest(p_channels, p_versions, p_types, p_blobs) AS v(channel, version, type, blob)
        ON CONFLICT DO NOTHING;
    END IF;
    UPDATE replaysafe.langgraph_checkpoints c
    SET checkpoint = p_checkpoint, metadata = p_metadata, run_id = p_metadata ->> 'run_id'
    WHERE c.tenant_id = p_tenant_id AND c.thread_id = p_thread_id
      AND c.checkpoint_ns = p_checkpoint_ns AND c.checkpoint_id = p_checkpoint_id;
    v_found := FOUND;
    IF NOT v_found THEN
        -- A new checkpoint: the head (the namespace is locked: no concurrent insert).
        INSERT INTO replaysafe.langgraph_checkpoints (
            tenant_id, thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, run_id,
            checkpoint, metadata, created_at)
        VALUES (p_tenant_id, p_thread_id, p_checkpoint_ns, p_checkpoint_id, p_parent_id,
                p_metadata ->> 'run_id', p_checkpoint, p_metadata, clock_timestamp());
        UPDATE replaysafe.langgraph_namespaces n SET head = p_checkpoint_id
        WHERE n.tenant_id = p_tenant_id AND n.thread_id = p_thread_id
          AND n.checkpoint_ns = p_checkpoint_ns;
        v_head := p_checkpoint_id;
    ELSE
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

CREATE OR REPLACE FUNCTION replaysafe.langgraph_get_tuple(
    p_tenant_id     text,
    p_thread_id     text,
    p_checkpoint_ns text DEFAULT '',
    p_checkpoint_id text DEFAULT NULL)
RETURNS SETOF replaysafe.langgraph_checkpoint_record
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id text := p_checkpoint_id;
BEGIN
    IF (octet_length(p_tenant_id) BETWEEN 1 AND 1024 AND length(p_tenant_id) <= 512
        AND octet_length(p_thread_id) BETWEEN 1 AND 1024 AND length(p_thread_id) <= 512
        AND octet_length(p_checkpoint_ns) <= 1024 AND length(p_checkpoint_ns) <= 512)
       IS NOT TRUE THEN
        PERFORM replaysafe._langgraph_check_args(p_tenant_id, p_thread_id, p_checkpoint_ns);
    END IF;
    -- The tenant check's common case inline: a caller bound to p_tenant_id, per _caller
    -- (which holds the security-restricted-operation probe). Anything else, and any argument
    -- with a COLLATE clause, takes _acts_for's whole path (its answer or its error). Both
    -- tests compare under "C" (see _acts_for).
    IF pg_collation_for(p_tenant_id) COLLATE "C" IS DISTINCT FROM '"default"'
       OR ((SELECT c.tenant_id FROM replaysafe._caller c) = p_tenant_id COLLATE "C") IS NOT TRUE THEN
        PERFORM replaysafe._acts_for(p_tenant_id);
    END IF;

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

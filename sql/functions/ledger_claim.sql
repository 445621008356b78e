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

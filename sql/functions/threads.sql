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

-- =======================================================================================
-- Versioned thread state (revision 0002): compare-and-swap writes, bounded history,
-- ownership by user id, tombstones that keep the version counter.
-- =======================================================================================

-- ---------------------------------------------------------------------------------------
-- Private tables. The 2 KB state is written once per version (in thread_versions); the head
-- row in threads holds only the counter, the owner and the pruning bookkeeping, so its
-- updates are small and HOT (no indexed column changes).
-- ---------------------------------------------------------------------------------------

CREATE TABLE replaysafe.threads (
    tenant_id     text NOT NULL,
    thread_id     text NOT NULL,
    -- The owner for good (also across delete); NULL: shared within the tenant.
    user_id       text,
    -- Current version: of the newest state, or of the tombstone when deleted.
    version       bigint NOT NULL CHECK (version >= 1),
    history_limit integer NOT NULL CHECK (history_limit >= 1),
    -- No thread_versions row below this version exists: pruning deletes the range
    -- [oldest_kept, new version - history_limit] and never scans what it deleted before.
    oldest_kept   bigint NOT NULL,
    deleted       boolean NOT NULL DEFAULT false,
    created_at    timestamptz NOT NULL,
    updated_at    timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, thread_id)
) WITH (fillfactor = 80);  -- room on the page for HOT updates of the head row

CREATE TABLE replaysafe.thread_versions (
    tenant_id  text NOT NULL,
    thread_id  text NOT NULL,
    version    bigint NOT NULL,
    state      jsonb NOT NULL,
    created_at timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, thread_id, version)
);

CREATE TYPE replaysafe.thread_record AS (
    version    bigint,
    state      jsonb,
    updated_at timestamptz
);

-- ---------------------------------------------------------------------------------------
-- Private helpers
-- ---------------------------------------------------------------------------------------

-- One message for every ownership refusal: it names neither the owner nor the version.
CREATE FUNCTION replaysafe._deny_thread()
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM replaysafe._raise('RS004', 'access denied: this user may not use that thread');
END
$$;

CREATE FUNCTION replaysafe._stale_thread(p_thread_id text, p_expected bigint, p_current bigint)
RETURNS void
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

-- Validation shared by the four thread functions; the valid path costs no function call
-- beyond the inlined _id_ok.
CREATE FUNCTION replaysafe._check_thread_args(p_tenant_id text, p_thread_id text, p_user_id text)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM replaysafe._check_id('p_tenant_id', p_tenant_id);
    PERFORM replaysafe._check_id('p_thread_id', p_thread_id);
    PERFORM replaysafe._check_id('p_user_id', p_user_id, true);
END
$$;

-- Raising forms usable inside read_thread's SQL expression. STABLE (they only read), so
-- the SQL function calling them can still be inlined.
CREATE FUNCTION replaysafe._thread_args_fail(p_tenant_id text, p_thread_id text, p_user_id text)
RETURNS boolean
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    PERFORM replaysafe._check_thread_args(p_tenant_id, p_thread_id, p_user_id);
    RETURN false;
END
$$;

CREATE FUNCTION replaysafe._tenant_or_deny(p_tenant_id text)
RETURNS boolean
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    IF NOT replaysafe._tenant_ok(p_tenant_id) THEN
        PERFORM replaysafe._deny_tenant();
    END IF;
    RETURN true;
END
$$;

CREATE FUNCTION replaysafe._thread_deny()
RETURNS boolean
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    PERFORM replaysafe._deny_thread();
    RETURN false;
END
$$;

-- ---------------------------------------------------------------------------------------
-- Public functions
-- ---------------------------------------------------------------------------------------

-- Latest state: (0, NULL, NULL) when the thread was never written; (tombstone version,
-- NULL, deleted at) after delete_thread. Always exactly one row.
--
-- Reads are the hot path, so this is one plain SQL query that Postgres inlines into the
-- caller's SELECT (no plpgsql call: that costs more server time than the lookups). The
-- checks are a CASE, evaluated in order: arguments (RS005); nothing found -> the tenant
-- check (RS004 for a tenant the role may not act for); another user's thread (RS004).
-- A row the caller can see is one it may SELECT anyway (row-level security), so the
-- tenant check runs only when nothing was found.
CREATE FUNCTION replaysafe.read_thread(
    p_tenant_id text,
    p_thread_id text,
    p_user_id   text DEFAULT NULL)
RETURNS SETOF replaysafe.thread_record
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

-- Compare-and-swap write. p_expected_version = 0 creates the thread (owned by p_user_id);
-- any other value must equal the current version (of the state or of a tombstone).
-- Returns the new version; RS003 when another write (or delete) got there first.
-- Prunes versions that fall outside the history limit: at most one row per write in the
-- steady state, the difference once when the limit is lowered.
CREATE FUNCTION replaysafe.write_thread(
    p_tenant_id        text,
    p_thread_id        text,
    p_expected_version bigint,
    p_state            jsonb,
    p_user_id          text    DEFAULT NULL,
    p_history_limit    integer DEFAULT NULL)
RETURNS bigint
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

-- Kept versions, newest first (at most p_limit). Empty for an absent or deleted thread.
CREATE FUNCTION replaysafe.thread_history(
    p_tenant_id text,
    p_thread_id text,
    p_user_id   text    DEFAULT NULL,
    p_limit     integer DEFAULT 100)
RETURNS TABLE (version bigint, state jsonb, created_at timestamptz)
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

-- Removes the state and its history; the head row stays as a tombstone one version up, so
-- the counter is never reused and the owner is kept. False for an absent or deleted thread.
CREATE FUNCTION replaysafe.delete_thread(
    p_tenant_id text,
    p_thread_id text,
    p_user_id   text DEFAULT NULL)
RETURNS boolean
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

-- ---------------------------------------------------------------------------------------
-- Audit view (security_invoker: row-level security of the reader applies). Ownership by
-- user id is enforced by the functions; direct SQL sees every thread of its tenant.
-- ---------------------------------------------------------------------------------------

CREATE VIEW replaysafe.threads_v WITH (security_invoker = true) AS
SELECT t.tenant_id, t.thread_id, t.user_id, t.version, t.deleted, v.state, t.history_limit,
       t.created_at, t.updated_at
FROM replaysafe.threads t
LEFT JOIN replaysafe.thread_versions v
       ON v.tenant_id = t.tenant_id AND v.thread_id = t.thread_id AND v.version = t.version;

-- ---------------------------------------------------------------------------------------
-- Row-level security, as for the ledger tables.
-- ---------------------------------------------------------------------------------------

ALTER TABLE replaysafe.threads ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_read ON replaysafe.threads FOR SELECT
    USING (tenant_id = (SELECT replaysafe._bound_tenant()) OR (SELECT replaysafe._reads_all_tenants()));
CREATE POLICY tenant_insert ON replaysafe.threads FOR INSERT
    WITH CHECK (tenant_id = (SELECT replaysafe._bound_tenant()));
CREATE POLICY tenant_update ON replaysafe.threads FOR UPDATE
    USING (tenant_id = (SELECT replaysafe._bound_tenant()))
    WITH CHECK (tenant_id = (SELECT replaysafe._bound_tenant()));
CREATE POLICY tenant_delete ON replaysafe.threads FOR DELETE
    USING (tenant_id = (SELECT replaysafe._bound_tenant()));

ALTER TABLE replaysafe.thread_versions ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_read ON replaysafe.thread_versions FOR SELECT
    USING (tenant_id = (SELECT replaysafe._bound_tenant()) OR (SELECT replaysafe._reads_all_tenants()));
CREATE POLICY tenant_insert ON replaysafe.thread_versions FOR INSERT
    WITH CHECK (tenant_id = (SELECT replaysafe._bound_tenant()));
CREATE POLICY tenant_update ON replaysafe.thread_versions FOR UPDATE
    USING (tenant_id = (SELECT replaysafe._bound_tenant()))
    WITH CHECK (tenant_id = (SELECT replaysafe._bound_tenant()));
CREATE POLICY tenant_delete ON replaysafe.thread_versions FOR DELETE
    USING (tenant_id = (SELECT replaysafe._bound_tenant()));

-- ---------------------------------------------------------------------------------------
-- Privileges
-- ---------------------------------------------------------------------------------------

REVOKE EXECUTE ON FUNCTION
    replaysafe._deny_thread(),
    replaysafe._stale_thread(text, bigint, bigint),
    replaysafe._check_thread_args(text, text, text),
    replaysafe._thread_args_fail(text, text, text),
    replaysafe._tenant_or_deny(text),
    replaysafe._thread_deny(),
    replaysafe.read_thread(text, text, text),
    replaysafe.write_thread(text, text, bigint, jsonb, text, integer),
    replaysafe.thread_history(text, text, text, integer),
    replaysafe.delete_thread(text, text, text)
FROM PUBLIC;

DO $grants$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'replaysafe_worker') THEN
        GRANT EXECUTE ON FUNCTION
            replaysafe._deny_thread(),
            replaysafe._stale_thread(text, bigint, bigint),
            replaysafe._check_thread_args(text, text, text),
            replaysafe._thread_args_fail(text, text, text),
            replaysafe._tenant_or_deny(text),
            replaysafe._thread_deny(),
            replaysafe.read_thread(text, text, text),
            replaysafe.write_thread(text, text, bigint, jsonb, text, integer),
            replaysafe.thread_history(text, text, text, integer),
            replaysafe.delete_thread(text, text, text)
        TO replaysafe_worker;
        GRANT SELECT, INSERT, UPDATE, DELETE ON replaysafe.threads, replaysafe.thread_versions
            TO replaysafe_worker;
        GRANT SELECT ON replaysafe.threads_v TO replaysafe_worker;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'replaysafe_auditor') THEN
        GRANT SELECT ON replaysafe.threads, replaysafe.thread_versions, replaysafe.threads_v
            TO replaysafe_auditor;
    END IF;
END
$grants$;

-- ---------------------------------------------------------------------------------------
-- LangGraph checkpoints (replaysafe_pg.langgraph, docs/langgraph.md): one function per
-- method of a LangGraph checkpointer. Channel values are stored once per (channel, version)
-- in langgraph_blobs; a checkpoint row holds the rest. The newest checkpoint of a thread and
-- namespace (its head) is the one put stored last, kept on its langgraph_namespaces row (not
-- the greatest id: an id made on a host whose clock lags sorts below its parent). Under a
-- tenant grant that names a user, only that user's threads are reachable (a thread becomes
-- theirs when they store into it first: _langgraph_user_thread). A
-- checkpoint written by the run loop (metadata source "input" or "loop") whose parent is not
-- the head is refused: two runs on one thread cannot fork it silently.
-- ---------------------------------------------------------------------------------------

-- Slow path of the argument checks: name the offending argument.
CREATE OR REPLACE FUNCTION replaysafe._langgraph_check_args(p_tenant_id text, p_thread_id text,
                                                 p_checkpoint_ns text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM replaysafe._check_id('p_tenant_id', p_tenant_id);
    PERFORM replaysafe._check_id('p_thread_id', p_thread_id);
    IF p_checkpoint_ns IS NULL OR length(p_checkpoint_ns) > 512
       OR octet_length(p_checkpoint_ns) > 1024 THEN
        PERFORM replaysafe._invalid('p_checkpoint_ns',
            'must be text of at most 512 characters and 1024 bytes');
    END IF;
END
$$;

-- RS005 unless the key columns of every row a call would store (thread, namespace,
-- checkpoint and task ids, channel and version: p_fixed bytes, plus element i of p_parts and
-- of p_more for each i) take at most p_max bytes (langgraph_key_bytes) together, and, with
-- the tenant id's p_tenant bytes, fit a primary key's index row (2,704 bytes less the row's
-- headers): over that, random ids do not compress and Postgres refuses the row (54000).
CREATE OR REPLACE FUNCTION replaysafe._langgraph_check_keys(p_tenant bigint, p_max bigint,
                                                            p_fixed bigint,
                                                            p_parts text[] DEFAULT '{}',
                                                            p_more text[] DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_bytes bigint := p_fixed;
BEGIN
    IF cardinality(p_parts) > 0 THEN
        SELECT p_fixed + max(octet_length(a.part) + coalesce(octet_length(a.more), 0)) INTO v_bytes
        FROM unnest(p_parts, p_more) AS a(part, more);
    END IF;
    IF v_bytes > p_max THEN
        PERFORM replaysafe._invalid('p_thread_id',
            'the thread, namespace, checkpoint and task ids and channel of a row take '
            || v_bytes || ' bytes together, over the limit of ' || p_max
            || ' bytes (replaysafe.limits langgraph_key_bytes)');
    ELSIF v_bytes + p_tenant > 2600 THEN
        PERFORM replaysafe._invalid('p_tenant_id',
            'the tenant id and the ids of a row take ' || (v_bytes + p_tenant)
            || ' bytes together, over the 2600 bytes an index row holds');
    END IF;
END
$$;

-- RS005 unless every blob takes at most p_max bytes (stored size); p_limit names its limit.
CREATE OR REPLACE FUNCTION replaysafe._langgraph_check_blobs(p_name text, p_blobs bytea[],
                                                             p_limit text, p_max bigint)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF cardinality(p_blobs) > 0 THEN
        PERFORM replaysafe._check_bytes(p_name, (SELECT max(pg_column_size(b)) FROM unnest(p_blobs) b),
                                        p_limit, p_max);
    END IF;
END
$$;

-- Hold a LangGraph thread for this transaction: its langgraph_threads row FOR KEY SHARE (made
-- first if the thread is new). A writer that creates a namespace (put, put_writes) and a copy
-- (on both its threads) hold it until they commit; a writer into an existing namespace holds
-- that namespace's row instead. So purge_threads (FOR UPDATE SKIP LOCKED on both) skips a
-- thread one of them is writing, also into a namespace no snapshot shows yet, and
-- langgraph_delete_thread (FOR UPDATE on both) waits for them. Row locks of tables only these
-- functions reach: no other role can take them, or see whose they are.
CREATE OR REPLACE FUNCTION replaysafe._langgraph_hold_thread(p_tenant_id text, p_thread_id text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM 1 FROM replaysafe.langgraph_threads t
    WHERE t.tenant_id = p_tenant_id AND t.thread_id = p_thread_id
    FOR KEY SHARE;
    IF NOT FOUND THEN
        INSERT INTO replaysafe.langgraph_threads (tenant_id, thread_id)
        VALUES (p_tenant_id, p_thread_id)
        ON CONFLICT DO NOTHING;
        PERFORM 1 FROM replaysafe.langgraph_threads t
        WHERE t.tenant_id = p_tenant_id AND t.thread_id = p_thread_id
        FOR KEY SHARE;
    END IF;
END
$$;

-- Under a tenant grant that names a user (p_user_id), the thread must be that user's: RS004
-- for another user's thread and for one of the whole tenant (made without such a grant).
-- p_claim: a thread that has nothing stored yet becomes the user's (a put, pending writes,
-- a copy's target). A thread that does not exist is no refusal for a read (it reads nothing).
CREATE OR REPLACE FUNCTION replaysafe._langgraph_user_thread(p_tenant_id text, p_thread_id text,
                                                             p_user_id text, p_claim boolean)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_owner text;
BEGIN
    IF p_user_id IS NULL THEN
        RETURN;
    END IF;
    FOR i IN 1..2 LOOP
        SELECT u.user_id INTO v_owner FROM replaysafe.langgraph_thread_users u
        WHERE u.tenant_id = p_tenant_id AND u.thread_id = p_thread_id;
        IF FOUND THEN
            IF v_owner COLLATE "C" <> p_user_id COLLATE "C" THEN
                PERFORM replaysafe._deny_thread();
            END IF;
            RETURN;
        END IF;
        IF EXISTS (SELECT 1 FROM replaysafe.langgraph_namespaces n
                   WHERE n.tenant_id = p_tenant_id AND n.thread_id = p_thread_id) THEN
            PERFORM replaysafe._deny_thread();  -- the whole tenant's thread
        END IF;
        IF NOT p_claim THEN
            RETURN;
        END IF;
        INSERT INTO replaysafe.langgraph_thread_users (tenant_id, thread_id, user_id)
        VALUES (p_tenant_id, p_thread_id, p_user_id)
        ON CONFLICT DO NOTHING;
        IF FOUND THEN
            RETURN;
        END IF;
        -- A concurrent claim made it someone's first: look again.
    END LOOP;
END
$$;

-- Lock the namespace row (created on first use) and return the ids it refused: exclusive for
-- a checkpoint write, shared for pending writes (they may go on concurrently).
CREATE OR REPLACE FUNCTION replaysafe._langgraph_namespace(p_tenant_id text, p_thread_id text,
                                                p_checkpoint_ns text, p_exclusive boolean)
RETURNS text[]
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_refused text[];
BEGIN
    FOR i IN 1..2 LOOP
        IF p_exclusive THEN
            SELECT n.refused INTO v_refused FROM replaysafe.langgraph_namespaces n
            WHERE n.tenant_id = p_tenant_id AND n.thread_id = p_thread_id
              AND n.checkpoint_ns = p_checkpoint_ns
            FOR NO KEY UPDATE;
        ELSE
            SELECT n.refused INTO v_refused FROM replaysafe.langgraph_namespaces n
            WHERE n.tenant_id = p_tenant_id AND n.thread_id = p_thread_id
              AND n.checkpoint_ns = p_checkpoint_ns
            FOR SHARE;
        END IF;
        IF FOUND THEN
            RETURN v_refused;
        END IF;
        -- A new namespace: no row of it yet that a delete or purge could lock, so the thread's
        -- lock row is held instead (_langgraph_hold_thread).
        PERFORM replaysafe._langgraph_hold_thread(p_tenant_id, p_thread_id);
        INSERT INTO replaysafe.langgraph_namespaces (tenant_id, thread_id, checkpoint_ns)
        VALUES (p_tenant_id, p_thread_id, p_checkpoint_ns)
        ON CONFLICT DO NOTHING;
    END LOOP;
    RETURN v_refused;
END
$$;

-- The head of a namespace: p_head (read from its row) while that checkpoint exists, else the
-- greatest id (the head was deleted since: delete_for_runs). NULL when it has no checkpoint.
CREATE OR REPLACE FUNCTION replaysafe._langgraph_head(p_tenant_id text, p_thread_id text,
                                           p_checkpoint_ns text, p_head text)
RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_head IS NOT NULL AND EXISTS (
           SELECT 1 FROM replaysafe.langgraph_checkpoints c
           WHERE c.tenant_id = p_tenant_id AND c.thread_id = p_thread_id
             AND c.checkpoint_ns = p_checkpoint_ns AND c.checkpoint_id = p_head) THEN
        RETURN p_head;
    END IF;
    RETURN (SELECT c.checkpoint_id FROM replaysafe.langgraph_checkpoints c
            WHERE c.tenant_id = p_tenant_id AND c.thread_id = p_thread_id
              AND c.checkpoint_ns = p_checkpoint_ns
            ORDER BY c.checkpoint_id DESC
            LIMIT 1);
END
$$;

-- Blobs of a namespace that no remaining checkpoint refers to.
CREATE OR REPLACE FUNCTION replaysafe._langgraph_collect_blobs(p_tenant_id text, p_thread_id text,
                                                    p_checkpoint_ns text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    DELETE FROM replaysafe.langgraph_blobs b
    WHERE b.tenant_id = p_tenant_id AND b.thread_id = p_thread_id
      AND b.checkpoint_ns = p_checkpoint_ns
      AND NOT EXISTS (
          SELECT 1 FROM replaysafe.langgraph_checkpoints c
          WHERE c.tenant_id = p_tenant_id AND c.thread_id = p_thread_id
            AND c.checkpoint_ns = p_checkpoint_ns
            AND (c.checkpoint -> 'channel_versions') ->> b.channel = b.version);
END
$$;

-- Store a checkpoint and the channel values new in it (p_channels, p_versions, p_types,
-- p_blobs: parallel arrays; a value already stored at that version is kept) and make it the
-- head of its thread and namespace (a checkpoint stored again keeps the head where it is).
-- A checkpoint of the run loop (metadata source "input" or "loop") is refused, and nothing
-- is stored, when its parent is not the head, or when it has no parent, the namespace has
-- checkpoints and it is a run's first (step -1) or records a run's work (versions_seen names
-- a task besides "__input__": its run began on an empty namespace); its pending writes are
-- dropped, now and when they arrive later. Branching on purpose (source "fork" or "update")
-- is never refused. p_history_limit: checkpoints kept per thread and namespace.
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
    p_history_limit integer DEFAULT NULL,
    p_grant         text    DEFAULT NULL)
RETURNS replaysafe.langgraph_put_record
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_user    text;
    v_refused text[];
    v_head    text;
    v_old     record;
    v_text    text;
    v_bad     boolean := false;
    v_fast    boolean := false;
    r         replaysafe.langgraph_put_record;
    l         replaysafe.limits;
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
    SELECT * INTO l FROM replaysafe.limits;
    PERFORM replaysafe._check_size('p_checkpoint', p_checkpoint, 'checkpoint_bytes',
                                   l.checkpoint_bytes, l.number_digits);
    PERFORM replaysafe._check_size('p_metadata', p_metadata, 'checkpoint_bytes',
                                   l.checkpoint_bytes, l.number_digits);
    IF p_channels IS NULL OR p_versions IS NULL OR p_types IS NULL OR p_blobs IS NULL
       OR cardinality(p_versions) <> cardinality(p_channels)
       OR cardinality(p_types) <> cardinality(p_channels)
       OR cardinality(p_blobs) <> cardinality(p_channels) THEN
        PERFORM replaysafe._invalid('p_channels',
            'p_channels, p_versions, p_types and p_blobs must be arrays of one length');
    END IF;
    -- Channels and versions are bounded like ids (they are keys of langgraph_blobs); a blob
    -- is NULL only for a channel emptied at this version.
    -- Loops of simple expressions rather than a query over the arrays (a few channels).
    FOREACH v_text IN ARRAY p_channels LOOP
        v_bad := v_bad OR (octet_length(v_text) BETWEEN 1 AND 1024
                           AND length(v_text) <= 512) IS NOT TRUE;
    END LOOP;
    FOREACH v_text IN ARRAY p_versions LOOP
        v_bad := v_bad OR (octet_length(v_text) BETWEEN 1 AND 1024
                           AND length(v_text) <= 512) IS NOT TRUE;
    END LOOP;
    FOREACH v_text IN ARRAY p_types LOOP
        v_bad := v_bad OR (octet_length(v_text) BETWEEN 1 AND 1024) IS NOT TRUE;
    END LOOP;
    IF v_bad THEN
        PERFORM replaysafe._invalid('p_channels',
            'every channel, version and type must be non-empty text of at most 512 characters '
            'and 1024 bytes');
    END IF;
    PERFORM replaysafe._langgraph_check_keys(octet_length(p_tenant_id), l.langgraph_key_bytes,
                                             octet_length(p_thread_id) + octet_length(p_checkpoint_ns)
                                             + octet_length(p_checkpoint_id));
    PERFORM replaysafe._langgraph_check_keys(octet_length(p_tenant_id), l.langgraph_key_bytes,
                                             octet_length(p_thread_id) + octet_length(p_checkpoint_ns),
                                             p_channels, p_versions);
    PERFORM replaysafe._langgraph_check_blobs('p_blobs', p_blobs, 'blob_bytes', l.blob_bytes);
    IF p_history_limit < 1 THEN
        PERFORM replaysafe._invalid('p_history_limit',
            'must be a positive number of checkpoints (got ' || p_history_limit || ')');
    END IF;
    -- The tenant check's common case inline: a caller bound to p_tenant_id (_binding), outside
    -- a security-restricted operation, without a grant. Anything else, and any argument with a
    -- COLLATE clause, takes _acts_for's whole path (its answer or its error). Both tests
    -- compare under "C" (see _acts_for).
    IF p_grant IS NOT NULL OR pg_collation_for(p_tenant_id) COLLATE "C" IS DISTINCT FROM '"default"'
       OR (replaysafe._binding() = p_tenant_id COLLATE "C") IS NOT TRUE
       OR replaysafe._in_restricted_operation() THEN
        v_user := replaysafe._acts_for(p_tenant_id, p_grant);
    END IF;
    -- A user's writer holds its thread before the owner check: a delete or purge that takes the
    -- thread meanwhile is waited for, and the check then sees what it left.
    IF v_user IS NOT NULL THEN
        PERFORM replaysafe._langgraph_hold_thread(p_tenant_id, p_thread_id);
    END IF;
    PERFORM replaysafe._langgraph_user_thread(p_tenant_id, p_thread_id, v_user, true);
    PERFORM replaysafe._durable();

    -- A put whose parent is the head (a run continuing: the common case) takes the
    -- namespace's lock by moving the head; no fork is possible, so no further reads.
    IF p_parent_id IS NOT NULL THEN
        UPDATE replaysafe.langgraph_namespaces n
        SET head = p_checkpoint_id, written_at = clock_timestamp()
        WHERE n.tenant_id = p_tenant_id AND n.thread_id = p_thread_id
          AND n.checkpoint_ns = p_checkpoint_ns AND n.head = p_parent_id;
        v_fast := FOUND;
    END IF;

    IF NOT v_fast THEN
        -- The namespace's lock (inline: the common case, a namespace already written to).
        SELECT n.refused, n.head INTO v_refused, v_head FROM replaysafe.langgraph_namespaces n
        WHERE n.tenant_id = p_tenant_id AND n.thread_id = p_thread_id
          AND n.checkpoint_ns = p_checkpoint_ns
        FOR NO KEY UPDATE;
        IF NOT FOUND THEN
            v_refused := replaysafe._langgraph_namespace(p_tenant_id, p_thread_id,
                                                         p_checkpoint_ns, true);
            -- Locked now; another put may have created the row (and a head) meanwhile.
            SELECT n.head INTO v_head FROM replaysafe.langgraph_namespaces n
            WHERE n.tenant_id = p_tenant_id AND n.thread_id = p_thread_id
              AND n.checkpoint_ns = p_checkpoint_ns;
        END IF;

        -- A run whose parent is not the head (or a first put): is it a fork?
        IF p_metadata ->> 'source' IN ('input', 'loop')
           AND p_parent_id IS DISTINCT FROM v_head THEN
            v_head := replaysafe._langgraph_head(p_tenant_id, p_thread_id, p_checkpoint_ns,
                                                 v_head);
            -- Saving the head again (same id) is no fork, nor is saving any checkpoint stored
            -- already (as stored it changes nothing; with other content it is refused below).
            IF v_head IS DISTINCT FROM p_checkpoint_id
               AND NOT EXISTS (SELECT 1 FROM replaysafe.langgraph_checkpoints c
                               WHERE c.tenant_id = p_tenant_id AND c.thread_id = p_thread_id
                                 AND c.checkpoint_ns = p_checkpoint_ns
                                 AND c.checkpoint_id = p_checkpoint_id)
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
                SET refused = (n.refused || p_checkpoint_id)
                              [greatest(1, cardinality(n.refused) - 30):]
                WHERE n.tenant_id = p_tenant_id AND n.thread_id = p_thread_id
                  AND n.checkpoint_ns = p_checkpoint_ns;
                r.stored := false;
                r.head_checkpoint_id := v_head;
                RETURN r;
            END IF;
        END IF;
    END IF;

    IF cardinality(p_channels) > 0 THEN
        INSERT INTO replaysafe.langgraph_blobs (tenant_id, thread_id, checkpoint_ns, channel,
                                                version, type, blob)
        SELECT p_tenant_id, p_thread_id, p_checkpoint_ns, v.channel, v.version, v.type, v.blob
        FROM unnest(p_channels, p_versions, p_types, p_blobs) AS v(channel, version, type, blob)
        ON CONFLICT DO NOTHING;
    END IF;
    -- A new checkpoint becomes the head (the namespace is locked: no concurrent insert); one
    -- stored before stays as it is (or the put is refused, below), and the head where it was.
    INSERT INTO replaysafe.langgraph_checkpoints (
        tenant_id, thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, run_id,
        checkpoint, metadata, created_at)
    VALUES (p_tenant_id, p_thread_id, p_checkpoint_ns, p_checkpoint_id, p_parent_id,
            p_metadata ->> 'run_id', p_checkpoint, p_metadata, clock_timestamp())
    ON CONFLICT DO NOTHING;
    IF FOUND THEN
        IF NOT v_fast THEN  -- the fast path moved the head already
            UPDATE replaysafe.langgraph_namespaces n
            SET head = p_checkpoint_id, written_at = clock_timestamp()
            WHERE n.tenant_id = p_tenant_id AND n.thread_id = p_thread_id
              AND n.checkpoint_ns = p_checkpoint_ns;
        END IF;
        v_head := p_checkpoint_id;
    ELSE
        IF v_fast THEN
            -- The head the fast path moved goes back, and so does the namespace's last write
            -- (nothing was stored).
            UPDATE replaysafe.langgraph_namespaces n
            SET head = p_parent_id,
                written_at = coalesce((SELECT max(c.created_at) FROM replaysafe.langgraph_checkpoints c
                                       WHERE c.tenant_id = p_tenant_id AND c.thread_id = p_thread_id
                                         AND c.checkpoint_ns = p_checkpoint_ns), n.written_at)
            WHERE n.tenant_id = p_tenant_id AND n.thread_id = p_thread_id
              AND n.checkpoint_ns = p_checkpoint_ns;
            v_head := p_parent_id;
        END IF;
        -- A stored checkpoint is never changed in place: saving it again is allowed only as it
        -- is (nothing changes); other content is refused and nothing of this put is kept.
        IF NOT EXISTS (SELECT 1 FROM replaysafe.langgraph_checkpoints c
                       WHERE c.tenant_id = p_tenant_id AND c.thread_id = p_thread_id
                         AND c.checkpoint_ns = p_checkpoint_ns AND c.checkpoint_id = p_checkpoint_id
                         AND c.checkpoint = p_checkpoint AND c.metadata = p_metadata
                         AND c.parent_checkpoint_id IS NOT DISTINCT FROM p_parent_id) THEN
            PERFORM replaysafe._raise('RS001', 'checkpoint ' || p_checkpoint_id || ' of thread '
                || p_thread_id || ' is stored already with other content: a stored checkpoint '
                'is never changed in place');
        END IF;
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

-- Store a task's pending writes on a checkpoint (parallel arrays). A write already stored
-- under the same task and index is kept, except, with p_replace, a write of one of
-- LangGraph's special channels (errors, scheduled tasks, interrupts, resumes: LangGraph
-- replaces them as a task goes on) by a write of the same channel. Writes on a checkpoint
-- the namespace refused are dropped. Returns the number of writes stored.
CREATE OR REPLACE FUNCTION replaysafe.langgraph_put_writes(
    p_tenant_id     text,
    p_thread_id     text,
    p_checkpoint_ns text,
    p_checkpoint_id text,
    p_task_id       text,
    p_task_path     text,
    p_idx           integer[],
    p_channels      text[],
    p_types         text[],
    p_blobs         bytea[],
    p_replace       boolean DEFAULT false,
    p_grant         text    DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_user    text;
    v_refused text[];
    v_count   integer;
    l         replaysafe.limits;
BEGIN
    IF (octet_length(p_tenant_id) BETWEEN 1 AND 1024 AND length(p_tenant_id) <= 512
        AND octet_length(p_thread_id) BETWEEN 1 AND 1024 AND length(p_thread_id) <= 512
        AND octet_length(p_checkpoint_ns) <= 1024 AND length(p_checkpoint_ns) <= 512)
       IS NOT TRUE THEN
        PERFORM replaysafe._langgraph_check_args(p_tenant_id, p_thread_id, p_checkpoint_ns);
    END IF;
    PERFORM replaysafe._check_id('p_checkpoint_id', p_checkpoint_id);
    PERFORM replaysafe._check_id('p_task_id', p_task_id);
    IF p_task_path IS NULL THEN
        PERFORM replaysafe._invalid('p_task_path', 'must not be NULL');
    END IF;
    IF p_idx IS NULL OR p_channels IS NULL OR p_types IS NULL OR p_blobs IS NULL
       OR cardinality(p_channels) <> cardinality(p_idx)
       OR cardinality(p_types) <> cardinality(p_idx)
       OR cardinality(p_blobs) <> cardinality(p_idx) THEN
        PERFORM replaysafe._invalid('p_idx',
            'p_idx, p_channels, p_types and p_blobs must be arrays of one length');
    END IF;
    IF cardinality(p_idx) > 0 AND EXISTS (
           SELECT 1 FROM unnest(p_idx, p_channels, p_types, p_blobs) AS w(idx, channel, type, blob)
           WHERE w.idx IS NULL OR w.channel IS NULL OR w.type IS NULL OR w.blob IS NULL) THEN
        PERFORM replaysafe._invalid('p_idx',
            'p_idx, p_channels, p_types and p_blobs must have no NULL element');
    END IF;
    SELECT * INTO l FROM replaysafe.limits;
    PERFORM replaysafe._langgraph_check_keys(octet_length(p_tenant_id), l.langgraph_key_bytes,
                                             octet_length(p_thread_id) + octet_length(p_checkpoint_ns)
                                             + octet_length(p_checkpoint_id)
                                             + octet_length(p_task_id), p_channels);
    PERFORM replaysafe._langgraph_check_blobs('p_blobs', p_blobs, 'pending_write_bytes',
                                              l.pending_write_bytes);
    v_user := replaysafe._acts_for(p_tenant_id, p_grant);
    -- A user's writer holds its thread before the owner check: a delete or purge that takes the
    -- thread meanwhile is waited for, and the check then sees what it left.
    IF v_user IS NOT NULL THEN
        PERFORM replaysafe._langgraph_hold_thread(p_tenant_id, p_thread_id);
    END IF;
    PERFORM replaysafe._langgraph_user_thread(p_tenant_id, p_thread_id, v_user, true);
    PERFORM replaysafe._durable();

    v_refused := replaysafe._langgraph_namespace(p_tenant_id, p_thread_id, p_checkpoint_ns, false);
    IF p_checkpoint_id = ANY (v_refused) THEN
        RETURN 0;
    END IF;
    IF p_replace THEN
        INSERT INTO replaysafe.langgraph_writes (tenant_id, thread_id, checkpoint_ns,
                                                 checkpoint_id, task_id, idx, channel, type,
                                                 blob, task_path)
        SELECT p_tenant_id, p_thread_id, p_checkpoint_ns, p_checkpoint_id, p_task_id, w.idx,
               w.channel, w.type, w.blob, p_task_path
        FROM unnest(p_idx, p_channels, p_types, p_blobs) AS w(idx, channel, type, blob)
        ON CONFLICT (tenant_id, thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE
        SET channel = excluded.channel, type = excluded.type, blob = excluded.blob,
            task_path = excluded.task_path
        WHERE langgraph_writes.channel = excluded.channel
          AND langgraph_writes.channel IN ('__error__', '__scheduled__', '__interrupt__', '__resume__');
    ELSE
        INSERT INTO replaysafe.langgraph_writes (tenant_id, thread_id, checkpoint_ns,
                                                 checkpoint_id, task_id, idx, channel, type,
                                                 blob, task_path)
        SELECT p_tenant_id, p_thread_id, p_checkpoint_ns, p_checkpoint_id, p_task_id, w.idx,
               w.channel, w.type, w.blob, p_task_path
        FROM unnest(p_idx, p_channels, p_types, p_blobs) AS w(idx, channel, type, blob)
        ON CONFLICT DO NOTHING;
    END IF;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END
$$;

-- One checkpoint with its values and pending writes: p_checkpoint_id's, or the head of the
-- thread and namespace (the checkpoint put stored last). No row when there is none.
CREATE OR REPLACE FUNCTION replaysafe.langgraph_get_tuple(
    p_tenant_id     text,
    p_thread_id     text,
    p_checkpoint_ns text DEFAULT '',
    p_checkpoint_id text DEFAULT NULL,
    p_grant         text DEFAULT NULL)
RETURNS SETOF replaysafe.langgraph_checkpoint_record
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_user    text;
    v_id text := p_checkpoint_id;
BEGIN
    IF (octet_length(p_tenant_id) BETWEEN 1 AND 1024 AND length(p_tenant_id) <= 512
        AND octet_length(p_thread_id) BETWEEN 1 AND 1024 AND length(p_thread_id) <= 512
        AND octet_length(p_checkpoint_ns) <= 1024 AND length(p_checkpoint_ns) <= 512)
       IS NOT TRUE THEN
        PERFORM replaysafe._langgraph_check_args(p_tenant_id, p_thread_id, p_checkpoint_ns);
    END IF;
    -- The tenant check's common case inline: a caller bound to p_tenant_id (_binding), outside
    -- a security-restricted operation, without a grant. Anything else, and any argument with a
    -- COLLATE clause, takes _acts_for's whole path (its answer or its error). Both tests
    -- compare under "C" (see _acts_for).
    IF p_grant IS NOT NULL OR pg_collation_for(p_tenant_id) COLLATE "C" IS DISTINCT FROM '"default"'
       OR (replaysafe._binding() = p_tenant_id COLLATE "C") IS NOT TRUE
       OR replaysafe._in_restricted_operation() THEN
        v_user := replaysafe._acts_for(p_tenant_id, p_grant);
    END IF;
    PERFORM replaysafe._langgraph_user_thread(p_tenant_id, p_thread_id, v_user, false);

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

-- Checkpoints newest first: of one thread (all threads of the tenant when p_thread_id is
-- NULL), one namespace (all when NULL), whose metadata contains p_filter, older than
-- p_before, at most p_limit (all when NULL).
CREATE OR REPLACE FUNCTION replaysafe.langgraph_list(
    p_tenant_id     text,
    p_thread_id     text    DEFAULT NULL,
    p_checkpoint_ns text    DEFAULT NULL,
    p_checkpoint_id text    DEFAULT NULL,
    p_filter        jsonb   DEFAULT NULL,
    p_before        text    DEFAULT NULL,
    p_limit         integer DEFAULT NULL,
    p_grant         text    DEFAULT NULL)
RETURNS SETOF replaysafe.langgraph_checkpoint_record
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_user text;
BEGIN
    PERFORM replaysafe._check_id('p_tenant_id', p_tenant_id);
    PERFORM replaysafe._check_id('p_thread_id', p_thread_id, true);
    IF p_filter IS NOT NULL AND jsonb_typeof(p_filter) <> 'object' THEN
        PERFORM replaysafe._invalid('p_filter', 'must be a JSON object');
    END IF;
    IF p_limit < 0 THEN
        PERFORM replaysafe._invalid('p_limit', 'must not be negative');
    END IF;
    v_user := replaysafe._acts_for(p_tenant_id, p_grant);
    PERFORM replaysafe._langgraph_user_thread(p_tenant_id, p_thread_id, v_user, false);

    RETURN QUERY
    SELECT c.thread_id, c.checkpoint_ns, c.checkpoint_id::text, c.parent_checkpoint_id::text,
           c.checkpoint, c.metadata, b.channels, b.types, b.blobs,
           w.task_ids, w.channels, w.types, w.blobs
    FROM (SELECT * FROM replaysafe.langgraph_checkpoints x
          WHERE x.tenant_id = p_tenant_id
            AND (p_thread_id IS NULL OR x.thread_id = p_thread_id)
            AND (v_user IS NULL OR x.thread_id IN (
                     SELECT u.thread_id FROM replaysafe.langgraph_thread_users u
                     WHERE u.tenant_id = p_tenant_id AND u.user_id = v_user))
            AND (p_checkpoint_ns IS NULL OR x.checkpoint_ns = p_checkpoint_ns)
            AND (p_checkpoint_id IS NULL OR x.checkpoint_id = p_checkpoint_id)
            AND (p_filter IS NULL OR x.metadata @> p_filter)
            AND (p_before IS NULL OR x.checkpoint_id < p_before COLLATE "C")
          ORDER BY x.checkpoint_id DESC
          LIMIT p_limit) c
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
          AND x.checkpoint_ns = c.checkpoint_ns AND x.checkpoint_id = c.checkpoint_id) w
    ORDER BY c.checkpoint_id DESC;
END
$$;

-- Every checkpoint, value and pending write of a thread (all namespaces). False when it had none.
-- Its namespaces are locked first: a put in flight is either deleted too or comes after.
CREATE OR REPLACE FUNCTION replaysafe.langgraph_delete_thread(p_tenant_id text, p_thread_id text,
                                                             p_grant text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_user    text;
    v_found boolean;
BEGIN
    PERFORM replaysafe._check_id('p_tenant_id', p_tenant_id);
    PERFORM replaysafe._check_id('p_thread_id', p_thread_id);
    v_user := replaysafe._acts_for(p_tenant_id, p_grant);
    -- Writers in flight first (a put into a new namespace holds no other row this could lock).
    PERFORM 1 FROM replaysafe.langgraph_threads t
    WHERE t.tenant_id = p_tenant_id AND t.thread_id = p_thread_id
    FOR UPDATE;
    PERFORM replaysafe._langgraph_user_thread(p_tenant_id, p_thread_id, v_user, false);
    PERFORM replaysafe._durable();

    PERFORM 1 FROM replaysafe.langgraph_namespaces n
    WHERE n.tenant_id = p_tenant_id AND n.thread_id = p_thread_id
    ORDER BY n.checkpoint_ns
    FOR UPDATE;
    DELETE FROM replaysafe.langgraph_checkpoints c
    WHERE c.tenant_id = p_tenant_id AND c.thread_id = p_thread_id;
    v_found := FOUND;
    DELETE FROM replaysafe.langgraph_writes w
    WHERE w.tenant_id = p_tenant_id AND w.thread_id = p_thread_id;
    DELETE FROM replaysafe.langgraph_blobs b
    WHERE b.tenant_id = p_tenant_id AND b.thread_id = p_thread_id;
    DELETE FROM replaysafe.langgraph_namespaces n
    WHERE n.tenant_id = p_tenant_id AND n.thread_id = p_thread_id;
    DELETE FROM replaysafe.langgraph_thread_users u  -- a deleted thread is nobody's
    WHERE u.tenant_id = p_tenant_id AND u.thread_id = p_thread_id;
    DELETE FROM replaysafe.langgraph_threads t
    WHERE t.tenant_id = p_tenant_id AND t.thread_id = p_thread_id;
    RETURN v_found;
END
$$;

-- The checkpoints whose metadata run_id is one of p_run_ids, with their pending writes and
-- the values no other checkpoint uses. Values are collected only in a namespace whose lock is
-- free (a put in flight may still use them; a later delete_for_runs or prune collects them).
-- Returns the number of checkpoints deleted.
CREATE OR REPLACE FUNCTION replaysafe.langgraph_delete_for_runs(p_tenant_id text, p_run_ids text[],
                                                               p_grant text DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_user    text;
    v_count   integer;
    v_threads text[];
    v_spaces  text[];
    v_ids     text[];  -- the deleted checkpoints, with their threads and namespaces:
    v_id_threads text[];
    v_id_spaces  text[];
    v_head    text;
BEGIN
    PERFORM replaysafe._check_id('p_tenant_id', p_tenant_id);
    IF p_run_ids IS NULL OR array_position(p_run_ids, NULL) IS NOT NULL THEN
        PERFORM replaysafe._invalid('p_run_ids', 'must be an array of run ids');
    END IF;
    v_user := replaysafe._acts_for(p_tenant_id, p_grant);
    PERFORM replaysafe._durable();

    -- The runs' namespaces locked first (waiting, in one order, as prune and delete_thread):
    -- a put or put_writes in flight there commits before its checkpoint, its pending writes
    -- and its values are looked at, so no head is left on a deleted checkpoint and no
    -- pending write of one survives (skipping a busy namespace would leave both).
    PERFORM 1 FROM replaysafe.langgraph_namespaces n
    WHERE n.tenant_id = p_tenant_id
      AND (n.thread_id, n.checkpoint_ns) IN (
          SELECT c.thread_id, c.checkpoint_ns FROM replaysafe.langgraph_checkpoints c
          WHERE c.tenant_id = p_tenant_id AND c.run_id = ANY (p_run_ids)
            AND (v_user IS NULL OR c.thread_id IN (
                     SELECT u.thread_id FROM replaysafe.langgraph_thread_users u
                     WHERE u.tenant_id = p_tenant_id AND u.user_id = v_user)))
    ORDER BY n.thread_id, n.checkpoint_ns
    FOR NO KEY UPDATE;

    WITH d AS (
        DELETE FROM replaysafe.langgraph_checkpoints c
        WHERE c.tenant_id = p_tenant_id AND c.run_id = ANY (p_run_ids)
          AND (v_user IS NULL OR c.thread_id IN (
                   SELECT u.thread_id FROM replaysafe.langgraph_thread_users u
                   WHERE u.tenant_id = p_tenant_id AND u.user_id = v_user))
        RETURNING c.thread_id, c.checkpoint_ns, c.checkpoint_id),
    w AS (
        DELETE FROM replaysafe.langgraph_writes x
        USING d
        WHERE x.tenant_id = p_tenant_id AND x.thread_id = d.thread_id
          AND x.checkpoint_ns = d.checkpoint_ns AND x.checkpoint_id = d.checkpoint_id)
    SELECT (SELECT count(*) FROM d), s.threads, s.spaces, i.threads, i.spaces, i.ids
    INTO v_count, v_threads, v_spaces, v_id_threads, v_id_spaces, v_ids
    FROM (SELECT array_agg(p.thread_id ORDER BY p.thread_id, p.checkpoint_ns) AS threads,
                 array_agg(p.checkpoint_ns ORDER BY p.thread_id, p.checkpoint_ns) AS spaces
          FROM (SELECT DISTINCT d.thread_id, d.checkpoint_ns FROM d) p) s,
         (SELECT array_agg(d.thread_id) AS threads, array_agg(d.checkpoint_ns) AS spaces,
                 array_agg(d.checkpoint_id) AS ids FROM d) i;
    FOR i IN 1..coalesce(cardinality(v_threads), 0) LOOP
        SELECT n.head INTO v_head FROM replaysafe.langgraph_namespaces n
        WHERE n.tenant_id = p_tenant_id AND n.thread_id = v_threads[i]
          AND n.checkpoint_ns = v_spaces[i]
        FOR NO KEY UPDATE;
        CONTINUE WHEN NOT FOUND;
        UPDATE replaysafe.langgraph_namespaces n
        SET head = replaysafe._langgraph_head(p_tenant_id, v_threads[i], v_spaces[i], v_head)
        WHERE n.tenant_id = p_tenant_id AND n.thread_id = v_threads[i]
          AND n.checkpoint_ns = v_spaces[i];
        PERFORM replaysafe._langgraph_collect_blobs(p_tenant_id, v_threads[i], v_spaces[i]);
    END LOOP;
    -- Every namespace is locked now (in the loop, in the same order, where a run's
    -- checkpoint committed between the lock above and the DELETE): a put_writes of a deleted
    -- checkpoint that was in flight there has committed; its writes go too.
    IF v_count > 0 THEN
        DELETE FROM replaysafe.langgraph_writes x
        USING unnest(v_id_threads, v_id_spaces, v_ids) AS d(thread_id, checkpoint_ns, id)
        WHERE x.tenant_id = p_tenant_id AND x.thread_id = d.thread_id
          AND x.checkpoint_ns = d.checkpoint_ns AND x.checkpoint_id = d.id;
    END IF;
    RETURN v_count;
END
$$;

-- Copy every checkpoint, value and pending write of a thread to a thread that has none
-- (RS005 when the target has checkpoints). Returns the number of checkpoints copied.
CREATE OR REPLACE FUNCTION replaysafe.langgraph_copy_thread(p_tenant_id text, p_source_thread_id text,
                                                 p_target_thread_id text, p_grant text DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_user    text;
    v_count integer;
    v_keys    bigint;
BEGIN
    PERFORM replaysafe._check_id('p_tenant_id', p_tenant_id);
    PERFORM replaysafe._check_id('p_source_thread_id', p_source_thread_id);
    PERFORM replaysafe._check_id('p_target_thread_id', p_target_thread_id);
    v_user := replaysafe._acts_for(p_tenant_id, p_grant);
    PERFORM replaysafe._langgraph_user_thread(p_tenant_id, p_source_thread_id, v_user, false);
    IF p_source_thread_id IS DISTINCT FROM p_target_thread_id
       AND EXISTS (SELECT 1 FROM replaysafe.langgraph_namespaces n
                   WHERE n.tenant_id = p_tenant_id AND n.thread_id = p_source_thread_id) THEN
        PERFORM replaysafe._langgraph_hold_thread(p_tenant_id, p_source_thread_id);
        PERFORM replaysafe._langgraph_hold_thread(p_tenant_id, p_target_thread_id);
    END IF;
    PERFORM replaysafe._langgraph_user_thread(p_tenant_id, p_target_thread_id, v_user, true);
    PERFORM replaysafe._durable();
    IF p_source_thread_id = p_target_thread_id THEN
        RETURN 0;
    END IF;
    -- The target's root namespace is locked while it is filled: no run writes into it meanwhile.
    PERFORM replaysafe._langgraph_namespace(p_tenant_id, p_target_thread_id, '', true);
    IF EXISTS (SELECT 1 FROM replaysafe.langgraph_checkpoints c
               WHERE c.tenant_id = p_tenant_id AND c.thread_id = p_target_thread_id) THEN
        PERFORM replaysafe._invalid('p_target_thread_id',
            'the target thread already has checkpoints (delete it first)');
    END IF;
    -- The source's rows under the target's thread id keep the key limits (_langgraph_check_keys).
    SELECT greatest(
        (SELECT max(octet_length(c.checkpoint_ns) + octet_length(c.checkpoint_id))
         FROM replaysafe.langgraph_checkpoints c
         WHERE c.tenant_id = p_tenant_id AND c.thread_id = p_source_thread_id),
        (SELECT max(octet_length(b.checkpoint_ns) + octet_length(b.channel) + octet_length(b.version))
         FROM replaysafe.langgraph_blobs b
         WHERE b.tenant_id = p_tenant_id AND b.thread_id = p_source_thread_id),
        (SELECT max(octet_length(w.checkpoint_ns) + octet_length(w.checkpoint_id)
                    + octet_length(w.task_id) + octet_length(w.channel))
         FROM replaysafe.langgraph_writes w
         WHERE w.tenant_id = p_tenant_id AND w.thread_id = p_source_thread_id))
    INTO v_keys;
    PERFORM replaysafe._langgraph_check_keys(octet_length(p_tenant_id), l.langgraph_key_bytes,
                                             octet_length(p_target_thread_id) + coalesce(v_keys, 0))
    FROM replaysafe.limits l;

    INSERT INTO replaysafe.langgraph_checkpoints (tenant_id, thread_id, checkpoint_ns,
        checkpoint_id, parent_checkpoint_id, run_id, checkpoint, metadata, created_at)
    SELECT c.tenant_id, p_target_thread_id, c.checkpoint_ns, c.checkpoint_id,
           c.parent_checkpoint_id, c.run_id, c.checkpoint, c.metadata, c.created_at
    FROM replaysafe.langgraph_checkpoints c
    WHERE c.tenant_id = p_tenant_id AND c.thread_id = p_source_thread_id;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    INSERT INTO replaysafe.langgraph_blobs (tenant_id, thread_id, checkpoint_ns, channel,
                                            version, type, blob)
    SELECT b.tenant_id, p_target_thread_id, b.checkpoint_ns, b.channel, b.version, b.type, b.blob
    FROM replaysafe.langgraph_blobs b
    WHERE b.tenant_id = p_tenant_id AND b.thread_id = p_source_thread_id
    ON CONFLICT DO NOTHING;
    INSERT INTO replaysafe.langgraph_writes (tenant_id, thread_id, checkpoint_ns, checkpoint_id,
                                             task_id, idx, channel, type, blob, task_path)
    SELECT w.tenant_id, p_target_thread_id, w.checkpoint_ns, w.checkpoint_id, w.task_id, w.idx,
           w.channel, w.type, w.blob, w.task_path
    FROM replaysafe.langgraph_writes w
    WHERE w.tenant_id = p_tenant_id AND w.thread_id = p_source_thread_id
    ON CONFLICT DO NOTHING;
    INSERT INTO replaysafe.langgraph_namespaces AS n (tenant_id, thread_id, checkpoint_ns, head)
    SELECT s.tenant_id, p_target_thread_id, s.checkpoint_ns, s.head
    FROM replaysafe.langgraph_namespaces s
    WHERE s.tenant_id = p_tenant_id AND s.thread_id = p_source_thread_id
    ON CONFLICT (tenant_id, thread_id, checkpoint_ns)
    DO UPDATE SET head = excluded.head, written_at = excluded.written_at;
    RETURN v_count;
END
$$;

-- Prune threads: "keep_latest" keeps the head of each namespace (with its
-- pending writes and the values it uses), "delete" removes everything. Returns the number
-- of checkpoints deleted.
CREATE OR REPLACE FUNCTION replaysafe.langgraph_prune(p_tenant_id text, p_thread_ids text[],
                                           p_strategy text DEFAULT 'keep_latest',
                                           p_grant text DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_user    text;
    v_count integer := 0;
    v_n     integer;
    v_head  text;
    r       record;
BEGIN
    PERFORM replaysafe._check_id('p_tenant_id', p_tenant_id);
    IF p_thread_ids IS NULL OR array_position(p_thread_ids, NULL) IS NOT NULL THEN
        PERFORM replaysafe._invalid('p_thread_ids', 'must be an array of thread ids');
    END IF;
    IF p_strategy IS NULL OR p_strategy NOT IN ('keep_latest', 'delete') THEN
        PERFORM replaysafe._invalid('p_strategy', 'must be keep_latest or delete (got '
            || coalesce(p_strategy, 'NULL') || ')');
    END IF;
    v_user := replaysafe._acts_for(p_tenant_id, p_grant);
    PERFORM replaysafe._langgraph_user_thread(p_tenant_id, t, v_user, false)
    FROM unnest(p_thread_ids) t;
    PERFORM replaysafe._durable();

    IF p_strategy = 'delete' THEN
        -- Locked first, as delete_thread: the threads (a writer creating a namespace holds its
        -- thread), then their namespaces.
        PERFORM 1 FROM replaysafe.langgraph_threads t
        WHERE t.tenant_id = p_tenant_id AND t.thread_id = ANY (p_thread_ids)
        ORDER BY t.thread_id
        FOR UPDATE;
        PERFORM 1 FROM replaysafe.langgraph_namespaces n
        WHERE n.tenant_id = p_tenant_id AND n.thread_id = ANY (p_thread_ids)
        ORDER BY n.thread_id, n.checkpoint_ns
        FOR UPDATE;
        DELETE FROM replaysafe.langgraph_checkpoints c
        WHERE c.tenant_id = p_tenant_id AND c.thread_id = ANY (p_thread_ids);
        GET DIAGNOSTICS v_count = ROW_COUNT;
        DELETE FROM replaysafe.langgraph_writes w
        WHERE w.tenant_id = p_tenant_id AND w.thread_id = ANY (p_thread_ids);
        DELETE FROM replaysafe.langgraph_blobs b
        WHERE b.tenant_id = p_tenant_id AND b.thread_id = ANY (p_thread_ids);
        DELETE FROM replaysafe.langgraph_namespaces n
        WHERE n.tenant_id = p_tenant_id AND n.thread_id = ANY (p_thread_ids);
        DELETE FROM replaysafe.langgraph_thread_users u
        WHERE u.tenant_id = p_tenant_id AND u.thread_id = ANY (p_thread_ids);
        DELETE FROM replaysafe.langgraph_threads t
        WHERE t.tenant_id = p_tenant_id AND t.thread_id = ANY (p_thread_ids);
        RETURN v_count;
    END IF;

    FOR r IN SELECT DISTINCT c.thread_id, c.checkpoint_ns FROM replaysafe.langgraph_checkpoints c
             WHERE c.tenant_id = p_tenant_id AND c.thread_id = ANY (p_thread_ids)
             ORDER BY c.thread_id, c.checkpoint_ns LOOP
        -- Locked like a checkpoint write: the head stays the head while we prune.
        PERFORM replaysafe._langgraph_namespace(p_tenant_id, r.thread_id, r.checkpoint_ns, true);
        SELECT n.head INTO v_head FROM replaysafe.langgraph_namespaces n
        WHERE n.tenant_id = p_tenant_id AND n.thread_id = r.thread_id
          AND n.checkpoint_ns = r.checkpoint_ns;
        v_head := replaysafe._langgraph_head(p_tenant_id, r.thread_id, r.checkpoint_ns, v_head);
        CONTINUE WHEN v_head IS NULL;
        UPDATE replaysafe.langgraph_namespaces n SET head = v_head
        WHERE n.tenant_id = p_tenant_id AND n.thread_id = r.thread_id
          AND n.checkpoint_ns = r.checkpoint_ns;
        DELETE FROM replaysafe.langgraph_checkpoints c
        WHERE c.tenant_id = p_tenant_id AND c.thread_id = r.thread_id
          AND c.checkpoint_ns = r.checkpoint_ns AND c.checkpoint_id <> v_head;
        GET DIAGNOSTICS v_n = ROW_COUNT;
        CONTINUE WHEN v_n = 0;
        v_count := v_count + v_n;
        UPDATE replaysafe.langgraph_checkpoints c SET parent_checkpoint_id = NULL
        WHERE c.tenant_id = p_tenant_id AND c.thread_id = r.thread_id
          AND c.checkpoint_ns = r.checkpoint_ns AND c.checkpoint_id = v_head;
        DELETE FROM replaysafe.langgraph_writes w
        WHERE w.tenant_id = p_tenant_id AND w.thread_id = r.thread_id
          AND w.checkpoint_ns = r.checkpoint_ns AND w.checkpoint_id <> v_head;
        PERFORM replaysafe._langgraph_collect_blobs(p_tenant_id, r.thread_id, r.checkpoint_ns);
    END LOOP;
    RETURN v_count;
END
$$;

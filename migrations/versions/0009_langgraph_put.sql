-- Revision 0009: langgraph_put's common case in fewer statements (issue 14). A put whose
-- parent is the namespace's head (a run continuing) moves the head in the UPDATE that takes
-- the namespace's lock, and inserts its checkpoint with ON CONFLICT DO NOTHING: three
-- statements fewer than 0008 (the SELECT ... FOR NO KEY UPDATE, the UPDATE of a checkpoint
-- that is not there yet, the query over the channel arrays, now loops of expressions).
-- Any other put takes 0008's path unchanged. langgraph_delete_for_runs waits for the runs'
-- namespaces instead of skipping a busy one (the security review of this revision: a put or
-- put_writes in flight left the head on a deleted checkpoint, a run-loop put could go on from
-- it, and a pending write of it survived). Same answers and errors otherwise; interfaces,
-- tables and grants unchanged (docs/performance.md#revision-0009-and-the-drivers-cursors).

SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);

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
    v_old     record;
    v_text    text;
    v_bad     boolean := false;
    v_fast    boolean := false;
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

    -- A put whose parent is the head (a run continuing: the common case) takes the
    -- namespace's lock by moving the head; no fork is possible, so no further reads.
    IF p_parent_id IS NOT NULL THEN
        UPDATE replaysafe.langgraph_namespaces n SET head = p_checkpoint_id
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
    -- stored before is updated, and the head stays where it was.
    INSERT INTO replaysafe.langgraph_checkpoints (
        tenant_id, thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, run_id,
        checkpoint, metadata, created_at)
    VALUES (p_tenant_id, p_thread_id, p_checkpoint_ns, p_checkpoint_id, p_parent_id,
            p_metadata ->> 'run_id', p_checkpoint, p_metadata, clock_timestamp())
    ON CONFLICT DO NOTHING;
    IF FOUND THEN
        IF NOT v_fast THEN  -- the fast path moved the head already
            UPDATE replaysafe.langgraph_namespaces n SET head = p_checkpoint_id
            WHERE n.tenant_id = p_tenant_id AND n.thread_id = p_thread_id
              AND n.checkpoint_ns = p_checkpoint_ns;
        END IF;
        v_head := p_checkpoint_id;
    ELSE
        IF v_fast THEN
            -- The head the fast path moved goes back.
            UPDATE replaysafe.langgraph_namespaces n SET head = p_parent_id
            WHERE n.tenant_id = p_tenant_id AND n.thread_id = p_thread_id
              AND n.checkpoint_ns = p_checkpoint_ns;
            v_head := p_parent_id;
        END IF;
        UPDATE replaysafe.langgraph_checkpoints c
        SET checkpoint = p_checkpoint, metadata = p_metadata, run_id = p_metadata ->> 'run_id'
        WHERE c.tenant_id = p_tenant_id AND c.thread_id = p_thread_id
          AND c.checkpoint_ns = p_checkpoint_ns AND c.checkpoint_id = p_checkpoint_id;
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

CREATE OR REPLACE FUNCTION replaysafe.langgraph_delete_for_runs(p_tenant_id text, p_run_ids text[])
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
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
    PERFORM replaysafe._acts_for(p_tenant_id);

    -- The runs' namespaces locked first (waiting, in one order, as prune and delete_thread):
    -- a put or put_writes in flight there commits before its checkpoint, its pending writes
    -- and its values are looked at, so no head is left on a deleted checkpoint and no
    -- pending write of one survives (revision 0009's security review; 0006-0008 skipped a
    -- namespace that was busy).
    PERFORM 1 FROM replaysafe.langgraph_namespaces n
    WHERE n.tenant_id = p_tenant_id
      AND (n.thread_id, n.checkpoint_ns) IN (
          SELECT c.thread_id, c.checkpoint_ns FROM replaysafe.langgraph_checkpoints c
          WHERE c.tenant_id = p_tenant_id AND c.run_id = ANY (p_run_ids))
    ORDER BY n.thread_id, n.checkpoint_ns
    FOR NO KEY UPDATE;

    WITH d AS (
        DELETE FROM replaysafe.langgraph_checkpoints c
        WHERE c.tenant_id = p_tenant_id AND c.run_id = ANY (p_run_ids)
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

-- Heads that 0006-0008's delete_for_runs left on a deleted checkpoint (it skipped a busy
-- namespace) go to the namespace's head as _langgraph_head finds it: a run-loop put from a
-- deleted checkpoint is refused again. Pending writes are left: they may precede their put.
UPDATE replaysafe.langgraph_namespaces n
SET head = replaysafe._langgraph_head(n.tenant_id, n.thread_id, n.checkpoint_ns, n.head)
WHERE n.head IS NOT NULL AND NOT EXISTS (
    SELECT 1 FROM replaysafe.langgraph_checkpoints c
    WHERE c.tenant_id = n.tenant_id AND c.thread_id = n.thread_id
      AND c.checkpoint_ns = n.checkpoint_ns AND c.checkpoint_id = n.head);

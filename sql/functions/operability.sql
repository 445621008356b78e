-- Operability: what a monitoring system scrapes (metrics) and age-based retention of
-- threads (purge_threads). docs/operability.md.

-- A planner estimate of a query's rows (EXPLAIN, nothing executed): the terminal actions and
-- the threads, which exact counts would read row by row. The query is the function's own
-- constant text, so the estimate is that of its plan; an empty table is 0, and a table never
-- analyzed (no statistics: the planner would guess) has no estimate (NULL).
CREATE OR REPLACE FUNCTION replaysafe._estimate(p_table regclass, p_query text)
RETURNS double precision
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_plan json;
BEGIN
    IF pg_catalog.pg_relation_size(p_table) = 0 THEN
        RETURN 0;
    END IF;
    IF (SELECT c.reltuples FROM pg_catalog.pg_class c WHERE c.oid = p_table) < 0 THEN
        RETURN NULL;
    END IF;
    EXECUTE 'EXPLAIN (FORMAT JSON) ' || p_query INTO v_plan;
    RETURN pg_catalog.round(((v_plan -> 0 -> 'Plan' ->> 'Plan Rows')::double precision));
END
$$;

-- Rows for a metrics scraper (name, tenant_id, state, value), of the caller's tenant (its
-- binding, or p_grant's tenant), or of every tenant for the schema owner and roles bound to
-- all tenants. Exact: the running, unknown and retryable actions, the unresolved ones
-- (unknown, or running with an expired lease), the oldest unresolved one's age in seconds
-- (0 when none), multi-effect actions and expired leases, each from index scans of those
-- rows only (a multi-effect action has a superseded successful report: of two successful
-- attempts only one can settle the action, and only a failed action can be reopened). Estimated (planner statistics, no row read): succeeded and failed actions and
-- live threads; for an all-tenant caller these are totals (tenant_id NULL). p_by_tenant
-- false: every row a total (tenant_id NULL), for installations with many tenants. A role
-- that acts for no tenant gets no row, as the views show it nothing.
CREATE OR REPLACE FUNCTION replaysafe.metrics(p_by_tenant boolean DEFAULT true,
                                              p_now timestamptz DEFAULT clock_timestamp(),
                                              p_grant text DEFAULT NULL)
RETURNS TABLE (name text, tenant_id text, state text, value double precision)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_tenant text;
    v_all    boolean;
BEGIN
    IF p_by_tenant IS NULL THEN
        PERFORM replaysafe._invalid('p_by_tenant', 'must be true or false');
    END IF;
    IF (p_now BETWEEN clock_timestamp() - interval '5 minutes' AND clock_timestamp()) IS NOT TRUE THEN
        p_now := replaysafe._check_now(p_now, p_grant);
    END IF;
    SELECT s.tenant_id, s.acts_for_all INTO v_tenant, v_all
    FROM replaysafe._sweep_scope(NULL, p_grant, '{worker,operator,auditor}') s;
    IF v_tenant IS NULL AND NOT v_all THEN
        RETURN;
    END IF;

    IF v_tenant IS NOT NULL THEN
        -- One tenant: each count an index range of that tenant's rows in that state.
        RETURN QUERY
        WITH c AS (
            SELECT (SELECT count(*) FROM replaysafe.actions x
                    WHERE x.tenant_id = v_tenant AND x.state = 'running') AS running,
                   (SELECT count(*) FROM replaysafe.actions x
                    WHERE x.tenant_id = v_tenant AND x.state = 'running'
                      AND x.lease_expires_at <= p_now) AS expired,
                   (SELECT count(*) FROM replaysafe.actions x
                    WHERE x.tenant_id = v_tenant AND x.state = 'unknown') AS unknown,
                   (SELECT count(*) FROM replaysafe.actions x
                    WHERE x.tenant_id = v_tenant AND x.state = 'retryable') AS retryable,
                   (SELECT min(x.updated_at) FROM replaysafe.actions x
                    WHERE x.tenant_id = v_tenant AND x.state = 'unknown') AS oldest_unknown,
                   (SELECT min(x.lease_expires_at) FROM replaysafe.actions x
                    WHERE x.tenant_id = v_tenant AND x.state = 'running'
                      AND x.lease_expires_at <= p_now) AS oldest_expired,
                   (SELECT count(DISTINCT t.action_key) FROM replaysafe.action_attempts t
                    WHERE t.tenant_id = v_tenant AND t.outcome = 'succeeded' AND t.superseded
                      AND EXISTS (SELECT 1 FROM replaysafe.action_attempts o
                                  WHERE o.tenant_id = t.tenant_id AND o.action_key = t.action_key
                                    AND o.attempt <> t.attempt AND o.outcome = 'succeeded'))
                       AS multi)
        SELECT m.name, CASE WHEN p_by_tenant THEN v_tenant END, m.state, m.value
        FROM c CROSS JOIN LATERAL (VALUES
            ('replaysafe_actions', 'running', c.running::double precision),
            ('replaysafe_actions', 'unknown', c.unknown::double precision),
            ('replaysafe_actions', 'retryable', c.retryable::double precision),
            ('replaysafe_unresolved_actions', NULL, (c.unknown + c.expired)::double precision),
            ('replaysafe_oldest_unresolved_age_seconds', NULL, coalesce(greatest(
                extract(epoch FROM p_now - c.oldest_unknown),
                extract(epoch FROM p_now - c.oldest_expired)), 0)::double precision),
            ('replaysafe_multi_effect_actions', NULL, c.multi::double precision),
            ('replaysafe_expired_leases', NULL, c.expired::double precision)) m(name, state, value);
        RETURN;
    END IF;

    -- Every tenant: the exact counts grouped by tenant through the partial indexes of those
    -- states (a tenant with none of a kind has no row of it), or one total each.
    RETURN QUERY
    WITH per AS (
        SELECT x.tenant_id, 'running'::text AS state, count(*) AS n,
               count(*) FILTER (WHERE x.lease_expires_at <= p_now) AS expired,
               min(x.lease_expires_at) FILTER (WHERE x.lease_expires_at <= p_now) AS oldest
        FROM replaysafe.actions x WHERE x.state = 'running' GROUP BY x.tenant_id
        UNION ALL
        SELECT x.tenant_id, 'unknown', count(*), 0, min(x.updated_at)
        FROM replaysafe.actions x WHERE x.state = 'unknown' GROUP BY x.tenant_id
        UNION ALL
        SELECT x.tenant_id, 'retryable', count(*), 0, NULL
        FROM replaysafe.actions x WHERE x.state = 'retryable' GROUP BY x.tenant_id
        UNION ALL
        SELECT t.tenant_id, 'multi', count(DISTINCT t.action_key), 0, NULL
        FROM replaysafe.action_attempts t
        WHERE t.outcome = 'succeeded' AND t.superseded
          AND EXISTS (SELECT 1 FROM replaysafe.action_attempts o
                      WHERE o.tenant_id = t.tenant_id AND o.action_key = t.action_key
                        AND o.attempt <> t.attempt AND o.outcome = 'succeeded')
        GROUP BY t.tenant_id
    ), labelled AS (
        SELECT CASE WHEN p_by_tenant THEN p.tenant_id END AS tenant_id, p.state, p.n,
               p.expired, p.oldest
        FROM per p
    ), tenants AS (
        SELECT l.tenant_id,
               sum(l.n) FILTER (WHERE l.state = 'running') AS running,
               sum(l.expired) FILTER (WHERE l.state = 'running') AS expired,
               sum(l.n) FILTER (WHERE l.state = 'unknown') AS unknown,
               sum(l.n) FILTER (WHERE l.state = 'retryable') AS retryable,
               sum(l.n) FILTER (WHERE l.state = 'multi') AS multi,
               min(l.oldest) FILTER (WHERE l.state IN ('running', 'unknown')) AS oldest
        FROM labelled l GROUP BY l.tenant_id
        -- The totals row exists even when nothing is running anywhere.
        UNION ALL
        SELECT NULL, 0, 0, 0, 0, 0, NULL
        WHERE p_by_tenant OR NOT EXISTS (SELECT 1 FROM labelled)
    ), totals AS (
        SELECT t.tenant_id, coalesce(sum(t.running), 0) AS running,
               coalesce(sum(t.expired), 0) AS expired, coalesce(sum(t.unknown), 0) AS unknown,
               coalesce(sum(t.retryable), 0) AS retryable, coalesce(sum(t.multi), 0) AS multi,
               min(t.oldest) AS oldest
        FROM tenants t GROUP BY t.tenant_id
    )
    SELECT m.name, t.tenant_id, m.state, m.value
    FROM totals t CROSS JOIN LATERAL (VALUES
        ('replaysafe_actions', 'running', t.running::double precision),
        ('replaysafe_actions', 'unknown', t.unknown::double precision),
        ('replaysafe_actions', 'retryable', t.retryable::double precision),
        ('replaysafe_unresolved_actions', NULL, (t.unknown + t.expired)::double precision),
        ('replaysafe_oldest_unresolved_age_seconds', NULL,
         coalesce(extract(epoch FROM p_now - t.oldest), 0)::double precision),
        ('replaysafe_multi_effect_actions', NULL, t.multi::double precision),
        ('replaysafe_expired_leases', NULL, t.expired::double precision)) m(name, state, value)
    -- With per-tenant labels the all-zero totals row only stands in for an empty installation.
    WHERE t.tenant_id IS NOT NULL OR NOT p_by_tenant
       OR NOT EXISTS (SELECT 1 FROM totals o WHERE o.tenant_id IS NOT NULL)
    UNION ALL
    SELECT e.name, NULL, e.state, e.value FROM (VALUES
        ('replaysafe_actions', 'succeeded', replaysafe._estimate('replaysafe.actions',
            'SELECT 1 FROM replaysafe.actions x WHERE x.state = ''succeeded''')),
        ('replaysafe_actions', 'failed', replaysafe._estimate('replaysafe.actions',
            'SELECT 1 FROM replaysafe.actions x WHERE x.state = ''failed''')),
        ('replaysafe_threads', NULL, replaysafe._estimate('replaysafe.threads',
            'SELECT 1 FROM replaysafe.threads t WHERE NOT t.deleted'))) e(name, state, value)
    WHERE e.value IS NOT NULL;
END
$$;

-- What purge_actions and purge_threads check before anything: the operator duty (EXECUTE is
-- the operators'; a grant to another role by mistake must not open it: with a tenant grant,
-- the grant's and the role's duties are checked with the tenant), p_older_than, p_limit and
-- p_now. Returns p_now, checked.
CREATE OR REPLACE FUNCTION replaysafe._check_purge(p_older_than interval, p_limit integer,
                                                   p_now timestamptz, p_grant text,
                                                   p_duty text)
RETURNS timestamptz
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_grant IS NULL AND NOT EXISTS (SELECT 1 FROM replaysafe._caller_scope c
                                       WHERE c.owner_or_operator) THEN
        PERFORM replaysafe._raise('RS004', 'access denied: ' || p_duty || ' replaysafe_operator''s duty');
    END IF;
    IF p_older_than IS NULL OR p_older_than < interval '0' OR p_older_than > interval '1000 years' THEN
        PERFORM replaysafe._invalid('p_older_than', 'must be a non-negative interval of at most 1000 years');
    END IF;
    IF p_limit IS NULL OR p_limit < 1 THEN
        PERFORM replaysafe._invalid('p_limit', 'must be a positive integer');
    END IF;
    IF (p_now BETWEEN clock_timestamp() - interval '5 minutes' AND clock_timestamp()) IS NOT TRUE THEN
        p_now := replaysafe._check_now(p_now, p_grant);
    END IF;
    RETURN p_now;
END
$$;

-- Age-based retention (operator): threads and LangGraph threads not written for
-- p_older_than, at most p_limit threads of each kind per call, of the caller's tenant
-- (p_tenant_id, the grant's tenant, or every tenant for the unbound owner and roles bound
-- to all tenants). A purged thread keeps its head row as a tombstone with its version
-- counter moved on, exactly as delete_thread leaves it, so a version is never reused; a
-- purged LangGraph thread is deleted as langgraph_delete_thread deletes it. Threads locked
-- by a writer are skipped, never waited for. Returns the number of threads purged.
CREATE OR REPLACE FUNCTION replaysafe.purge_threads(
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
    v_tenant  text;
    v_all     boolean;
    v_cutoff  timestamptz;
    v_count   integer := 0;
    v_n       integer;
    v_tenants text[];
    v_threads text[];
BEGIN
    p_now := replaysafe._check_purge(p_older_than, p_limit, p_now, p_grant, 'purging threads is');
    IF p_grant IS NOT NULL
       AND replaysafe._acts_with_grant(p_tenant_id, p_grant, '{operator}') ->> 'sub' IS NOT NULL THEN
        PERFORM replaysafe._raise('RS004', 'access denied: a grant that names a user cannot '
                                           'purge the tenant''s threads');
    END IF;
    SELECT t.tenant_id, t.acts_for_all INTO v_tenant, v_all
    FROM replaysafe._sweep_scope(p_tenant_id, p_grant, '{operator}') t;
    IF v_tenant IS NULL AND NOT v_all THEN
        RETURN 0;
    END IF;
    v_cutoff := p_now - p_older_than;
    PERFORM replaysafe._durable();

    -- Versioned threads: the oldest live heads not written since the cutoff, locked. Found
    -- by a scan of the heads: an index on updated_at would make every write_thread's update
    -- of its head row a non-HOT one.
    SELECT array_agg(d.tenant_id), array_agg(d.thread_id) INTO v_tenants, v_threads
    FROM (SELECT x.tenant_id, x.thread_id FROM replaysafe.threads x
          WHERE NOT x.deleted AND x.updated_at < v_cutoff
            AND (v_tenant IS NULL OR x.tenant_id = v_tenant)
          ORDER BY x.updated_at LIMIT p_limit FOR UPDATE SKIP LOCKED) d;
    IF v_threads IS NOT NULL THEN
        WITH victims AS (
            UPDATE replaysafe.threads x
            SET version = x.version + 1, deleted = true, oldest_kept = x.version + 2,
                updated_at = clock_timestamp()
            FROM unnest(v_tenants, v_threads) AS k(tenant_id, thread_id)
            WHERE x.tenant_id = k.tenant_id AND x.thread_id = k.thread_id
            RETURNING x.tenant_id, x.thread_id, x.version AS tombstone
        ), gone AS (
            DELETE FROM replaysafe.thread_versions v
            USING victims k
            WHERE v.tenant_id = k.tenant_id AND v.thread_id = k.thread_id
              AND v.version < k.tombstone
            RETURNING 1
        )
        SELECT count(*) INTO v_n FROM victims;
        v_count := v_count + v_n;
    END IF;

    -- LangGraph threads no namespace of which was written since the cutoff, found by a scan
    -- of the threads (written_at is not indexed: a put's update of the head stays HOT), each
    -- taken by its lock row, skipped when a writer holds it (a put or pending write in flight,
    -- also into a namespace no snapshot shows yet). Once this call holds it, writers wait; a
    -- thread is kept if one wrote to it before that (checked in a statement whose snapshot is
    -- taken after the locks), or if another transaction holds one of its namespaces.
    SELECT array_agg(d.tenant_id), array_agg(d.thread_id) INTO v_tenants, v_threads
    FROM (SELECT t.tenant_id, t.thread_id FROM replaysafe.langgraph_threads t
          WHERE (v_tenant IS NULL OR t.tenant_id = v_tenant)
            AND NOT EXISTS (SELECT 1 FROM replaysafe.langgraph_namespaces n
                            WHERE n.tenant_id = t.tenant_id AND n.thread_id = t.thread_id
                              AND n.written_at >= v_cutoff)
          LIMIT p_limit
          FOR UPDATE SKIP LOCKED) d;
    IF v_threads IS NOT NULL THEN
        SELECT array_agg(v.tenant_id), array_agg(v.thread_id) INTO v_tenants, v_threads
        FROM unnest(v_tenants, v_threads) AS v(tenant_id, thread_id)
        WHERE NOT EXISTS (SELECT 1 FROM replaysafe.langgraph_namespaces n
                          WHERE n.tenant_id = v.tenant_id AND n.thread_id = v.thread_id
                            AND n.written_at >= v_cutoff)
          AND (SELECT count(*) FROM replaysafe.langgraph_namespaces n
               WHERE n.tenant_id = v.tenant_id AND n.thread_id = v.thread_id)
            = (SELECT count(*) FROM (SELECT 1 FROM replaysafe.langgraph_namespaces n
                                     WHERE n.tenant_id = v.tenant_id AND n.thread_id = v.thread_id
                                     ORDER BY n.checkpoint_ns
                                     FOR UPDATE SKIP LOCKED) l);
    END IF;
    IF v_threads IS NOT NULL THEN
        WITH k AS (SELECT * FROM unnest(v_tenants, v_threads) AS k(tenant_id, thread_id)),
        c AS (DELETE FROM replaysafe.langgraph_checkpoints x USING k
              WHERE x.tenant_id = k.tenant_id AND x.thread_id = k.thread_id RETURNING 1),
        w AS (DELETE FROM replaysafe.langgraph_writes x USING k
              WHERE x.tenant_id = k.tenant_id AND x.thread_id = k.thread_id RETURNING 1),
        b AS (DELETE FROM replaysafe.langgraph_blobs x USING k
              WHERE x.tenant_id = k.tenant_id AND x.thread_id = k.thread_id RETURNING 1),
        n AS (DELETE FROM replaysafe.langgraph_namespaces x USING k
              WHERE x.tenant_id = k.tenant_id AND x.thread_id = k.thread_id RETURNING 1),
        u AS (DELETE FROM replaysafe.langgraph_thread_users x USING k
              WHERE x.tenant_id = k.tenant_id AND x.thread_id = k.thread_id RETURNING 1),
        t AS (DELETE FROM replaysafe.langgraph_threads x USING k
              WHERE x.tenant_id = k.tenant_id AND x.thread_id = k.thread_id RETURNING 1)
        SELECT count(*) INTO v_n FROM k;
        v_count := v_count + v_n;
    END IF;
    RETURN v_count;
END
$$;

-- Revision 0004: what readers need, and a hole closed.
-- * A COLLATE clause on any argument is refused (RS005): PL/pgSQL gives every collatable
--   argument the call's collation, and a worker's own nondeterministic collation in pg_temp
--   made its tenant id equal another's inside every function (complete another tenant's
--   attempt with a forged result, read its threads).
-- * The installed revision, readable by every replaysafe role: `doctor` and `migrate current`
--   run as the least-privileged roles the docs recommend (a worker, an auditor), which hold
--   no privilege on any table, the version table included.
-- * multi_effect_actions reads a tenant's attempts and then looks up only its multi-effect
--   actions (it joined every tenant's actions: 7.5x slower at 100 k actions than at 10 k
--   for the same tenant, bench/scale_bench.py).
-- * A tenant's sweep reads its own expired leases through a (tenant_id, lease_expires_at)
--   index, not everyone's (15.7x slower at 1 M actions than at 10 k); a tenant's purge its
--   own old actions through (tenant_id, completed_at) (467x slower at 10 M than at 10 k: a
--   second per batch); a tenant's unknown actions (unresolved_actions, reconciliation's work
--   list) come from a (tenant_id, updated_at) index; no query through the views starts
--   parallel workers (their start-up cost ~15 ms a query at 10 M actions, against ~2 ms of work:
--   unresolved_actions 6.9x and multi_effect_actions 5.6x slower than at 10 k).
SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);

CREATE OR REPLACE VIEW replaysafe.multi_effect_actions WITH (security_barrier = true) AS
SELECT m.tenant_id, m.action_key, a.operation, m.successful_attempts
FROM (SELECT t.tenant_id, t.action_key, count(*) AS successful_attempts
      FROM replaysafe._visible_attempts t
      WHERE t.outcome = 'succeeded'
      GROUP BY t.tenant_id, t.action_key
      HAVING count(*) > 1) m
-- One primary-key lookup per multi-effect action (LIMIT keeps the planner from a hash join
-- that reads every tenant's actions).
CROSS JOIN LATERAL (SELECT x.operation FROM replaysafe.actions x
                    WHERE x.tenant_id = m.tenant_id AND x.action_key = m.action_key LIMIT 1) a;

CREATE FUNCTION replaysafe.installed_revision() RETURNS text
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    -- One row on a linear chain; the version table is created by alembic, not by this
    -- script, so the name is resolved at call time.
    RETURN (SELECT pg_catalog.string_agg(v.version_num::text, ' ' ORDER BY v.version_num)
            FROM replaysafe.alembic_version v);
EXCEPTION WHEN undefined_table THEN
    RETURN NULL;
END
$$;

CREATE INDEX actions_tenant_running_lease_idx ON replaysafe.actions (tenant_id, lease_expires_at)
    WHERE state = 'running';

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
    v_tenants text[];
    v_actions text[];
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

    -- The batch first, locked: through (tenant_id, lease_expires_at) for a tenant's sweep, so it
    -- never walks other tenants' expired leases; through (lease_expires_at) for everyone's.
    IF v_tenant IS NULL THEN
        SELECT array_agg(d.tenant_id), array_agg(d.action_key) INTO v_tenants, v_actions
        FROM (SELECT x.tenant_id, x.action_key FROM replaysafe.actions x
              WHERE x.state = 'running' AND x.lease_expires_at <= p_now
              ORDER BY x.lease_expires_at LIMIT p_limit FOR UPDATE SKIP LOCKED) d;
    ELSE
        SELECT array_agg(d.tenant_id), array_agg(d.action_key) INTO v_tenants, v_actions
        FROM (SELECT x.tenant_id, x.action_key FROM replaysafe.actions x
              WHERE x.tenant_id = v_tenant AND x.state = 'running' AND x.lease_expires_at <= p_now
              ORDER BY x.lease_expires_at LIMIT p_limit FOR UPDATE SKIP LOCKED) d;
    END IF;
    IF v_actions IS NULL THEN
        RETURN 0;
    END IF;

    WITH due AS (
        SELECT x.tenant_id, x.action_key, x.attempt, x.on_expired, x.has_waiters,
               x.idempotency_key, x.lease_expires_at
        FROM unnest(v_tenants, v_actions) AS k(tenant_id, action_key)
        JOIN replaysafe.actions x ON x.tenant_id = k.tenant_id AND x.action_key = k.action_key
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

CREATE INDEX actions_tenant_terminal_completed_idx ON replaysafe.actions (tenant_id, completed_at)
    WHERE state IN ('succeeded', 'failed');
DROP INDEX replaysafe.actions_unknown_idx;
CREATE INDEX actions_unknown_idx ON replaysafe.actions (tenant_id, updated_at)
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
    v_tenants text[];
    v_actions text[];
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

    -- The batch first, locked: through (tenant_id, completed_at) for a tenant's purge, so it
    -- never walks other tenants' old actions; through (completed_at) for everyone's.
    IF v_tenant IS NULL THEN
        SELECT array_agg(d.tenant_id), array_agg(d.action_key) INTO v_tenants, v_actions
        FROM (SELECT x.tenant_id, x.action_key FROM replaysafe.actions x
              WHERE x.state IN ('succeeded', 'failed') AND x.completed_at < p_now - p_older_than
              ORDER BY x.completed_at LIMIT p_limit FOR UPDATE SKIP LOCKED) d;
    ELSE
        SELECT array_agg(d.tenant_id), array_agg(d.action_key) INTO v_tenants, v_actions
        FROM (SELECT x.tenant_id, x.action_key FROM replaysafe.actions x
              WHERE x.tenant_id = v_tenant AND x.state IN ('succeeded', 'failed')
                AND x.completed_at < p_now - p_older_than
              ORDER BY x.completed_at LIMIT p_limit FOR UPDATE SKIP LOCKED) d;
    END IF;
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
    -- argument made 'acme' equal 'ACME' here and in every key lookup after it.
    IF pg_collation_for(p_tenant_id) IS DISTINCT FROM '"default"' THEN
        PERFORM replaysafe._invalid('p_tenant_id', 'the arguments must not carry a COLLATE clause '
                                    '(comparisons use the database''s collation)');
    END IF;
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
WHERE n.nspname = 'replaysafe'
  -- Always true, and parallel unsafe: no query through the views starts parallel workers.
  -- They cost ~15 ms of start-up at 1 M actions and more, against ~2 ms for a tenant's rows,
  -- and the planner, counting every tenant's rows in the readers-of-everything branch,
  -- would start them for any aggregate over a tenant.
  AND pg_current_xact_id_if_assigned() IS DISTINCT FROM '0'::xid8;


-- Every privilege but the owner's goes (PUBLIC's default EXECUTE and whatever ALTER DEFAULT
-- PRIVILEGES added), then the grants of schema.sql.
DO $grants$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT DISTINCT a.grantee
             FROM pg_catalog.pg_proc p,
                  pg_catalog.aclexplode(coalesce(p.proacl, pg_catalog.acldefault('f', p.proowner))) a
             WHERE p.oid = 'replaysafe.installed_revision()'::pg_catalog.regprocedure
               AND a.grantee <> p.proowner LOOP
        EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION replaysafe.installed_revision() FROM %s',
            CASE WHEN r.grantee = 0 THEN 'PUBLIC' ELSE r.grantee::pg_catalog.regrole::text END);
    END LOOP;
    -- In schema.sql's order (worker, auditor, operator): the ACL keeps the order of the
    -- grants, and the dump comparison with schema.sql sees it (pg_roles' order varies).
    FOR r IN SELECT g.rolname FROM pg_catalog.unnest(
                 ARRAY['replaysafe_worker', 'replaysafe_auditor', 'replaysafe_operator'])
                 WITH ORDINALITY AS g(rolname, n)
             WHERE EXISTS (SELECT 1 FROM pg_catalog.pg_roles x WHERE x.rolname = g.rolname)
             ORDER BY g.n LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION replaysafe.installed_revision() TO %I',
                                  r.rolname);
    END LOOP;
END
$grants$;

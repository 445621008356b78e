-- Revision 0004: what readers need.
-- * The installed revision, readable by every replaysafe role: `doctor` and `migrate current`
--   run as the least-privileged roles the docs recommend (a worker, an auditor), which hold
--   no privilege on any table, the version table included.
-- * multi_effect_actions reads a tenant's attempts and then looks up only its multi-effect
--   actions (it joined every tenant's actions: 7.5x slower at 100 k actions than at 10 k
--   for the same tenant, bench/scale_bench.py).
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
    FOR r IN SELECT rolname FROM pg_catalog.pg_roles
             WHERE rolname IN ('replaysafe_worker', 'replaysafe_auditor', 'replaysafe_operator') LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION replaysafe.installed_revision() TO %I',
                                  r.rolname);
    END LOOP;
END
$grants$;

-- Downgrade of 0004.
SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
DROP FUNCTION replaysafe.installed_revision();
CREATE OR REPLACE VIEW replaysafe.multi_effect_actions WITH (security_barrier = true) AS
SELECT t.tenant_id, t.action_key, a.operation, count(*) AS successful_attempts
FROM replaysafe._visible_attempts t
JOIN replaysafe.actions a ON a.tenant_id = t.tenant_id AND a.action_key = t.action_key
WHERE t.outcome = 'succeeded'
GROUP BY t.tenant_id, t.action_key, a.operation
HAVING count(*) > 1;

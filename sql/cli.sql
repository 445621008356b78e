-- The queries of the `replaysafe-pg` command, one per "-- name: ... --" marker.
-- They read the audit views (row-level security of the caller applies) and call the
-- public functions with named arguments, like any other client.

-- name: server_info --
SELECT current_setting('server_version') AS server_version, current_user::text AS role, current_database()::text AS database

-- name: group_roles --
SELECT r.name, EXISTS (SELECT 1 FROM pg_catalog.pg_roles p WHERE p.rolname = r.name) AS present FROM unnest(ARRAY['replaysafe_worker', 'replaysafe_auditor']) AS r(name) ORDER BY r.name

-- name: table_rls --
SELECT c.relname::text AS table_name, c.relrowsecurity AS rls_enabled FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'replaysafe' AND c.relkind IN ('r', 'p') AND c.relname <> 'alembic_version' ORDER BY c.relname

-- name: counts_by_state --
SELECT state::text AS state, count(*) AS actions FROM replaysafe.actions_v GROUP BY state ORDER BY state

-- name: list_actions --
SELECT tenant_id, action_key, operation, state::text AS state, attempt, thread_id, created_at, updated_at, lease_expires_at FROM replaysafe.actions_v WHERE (%(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s::text) AND (cardinality(%(states)s::text[]) = 0 OR state::text = ANY (%(states)s::text[])) AND (%(operation)s::text IS NULL OR operation = %(operation)s::text) AND (%(thread_id)s::text IS NULL OR thread_id = %(thread_id)s::text) AND (%(older_than)s::interval IS NULL OR created_at < now() - %(older_than)s::interval) ORDER BY created_at DESC, tenant_id, action_key LIMIT %(limit)s::integer

-- name: unresolved_actions --
SELECT tenant_id, action_key, operation, state::text AS state, lease_expires_at, age, thread_id FROM replaysafe.unresolved_actions WHERE (%(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s::text) ORDER BY age DESC, tenant_id, action_key

-- name: multi_effect_actions --
SELECT tenant_id, action_key, operation, successful_attempts FROM replaysafe.multi_effect_actions WHERE (%(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s::text) ORDER BY tenant_id, action_key

-- name: purge_candidates --
SELECT count(*) FROM replaysafe.actions_v WHERE state IN ('succeeded', 'failed') AND completed_at < %(now)s::timestamptz - %(older_than)s::interval

-- name: database_now --
SELECT now()

-- name: read_thread --
SELECT version, state, updated_at FROM replaysafe.read_thread(p_tenant_id => %(tenant_id)s, p_thread_id => %(thread_id)s, p_user_id => %(user_id)s::text)

-- name: thread_history --
SELECT version, state, created_at FROM replaysafe.thread_history(p_tenant_id => %(tenant_id)s, p_thread_id => %(thread_id)s, p_user_id => %(user_id)s::text, p_limit => %(limit)s::integer)
